//! A hand-encoded `xla.CompileOptionsProto` (the few fields redco sets), so no protobuf
//! compiler or XLA proto sources are needed.
//!
//! Field numbers from `xla/pjrt/proto/compile_options.proto` and `xla/xla_data.proto`:
//! `CompileOptionsProto { executable_build_options = 3, compile_portable_executable = 4 }`,
//! `ExecutableBuildOptionsProto { device_ordinal = 1, num_replicas = 4, num_partitions = 5,
//! use_spmd_partitioning = 6, device_assignment = 9 }`, `DeviceAssignmentProto {
//! replica_count = 1, computation_count = 2, computation_devices = 3 { replica_device_ids
//! = 1 } }`.

/// What a program is compiled for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompileOptions {
    /// Replicas of the program (one per device of an SPMD mesh run by replica groups);
    /// 0 means 1.
    pub num_replicas: i64,
    /// Partitions of the program (XLA's SPMD partitioner); 0 means 1.
    pub num_partitions: i64,
    /// Partition with XLA's SPMD partitioner when `num_partitions > 1`.
    pub use_spmd_partitioning: bool,
    /// Device ids per replica (`[replica][partition]`), or `None` for the plugin's default.
    pub device_assignment: Option<Vec<Vec<i64>>>,
    /// Compile a single-device program that may run on any device (chosen at execution).
    pub portable: bool,
}

impl CompileOptions {
    /// A one-device program that runs on whichever device executes it.
    pub fn portable() -> CompileOptions {
        CompileOptions { num_replicas: 1, num_partitions: 1, portable: true, ..Default::default() }
    }

    /// A program replicated over `devices` (one replica each), for collectives with
    /// replica groups.
    pub fn replicated(devices: &[i64]) -> CompileOptions {
        CompileOptions {
            num_replicas: devices.len() as i64,
            num_partitions: 1,
            device_assignment: Some(devices.iter().map(|&d| vec![d]).collect()),
            ..Default::default()
        }
    }

    /// The serialized `CompileOptionsProto`.
    pub fn encode(&self) -> Vec<u8> {
        let mut build = Vec::new();
        int_field(&mut build, 1, -1); // device_ordinal: unset
        int_field(&mut build, 4, self.num_replicas.max(1));
        int_field(&mut build, 5, self.num_partitions.max(1));
        if self.use_spmd_partitioning {
            int_field(&mut build, 6, 1);
        }
        if let Some(da) = &self.device_assignment {
            let mut m = Vec::new();
            int_field(&mut m, 1, da.len() as i64);
            int_field(&mut m, 2, da.first().map_or(1, |r| r.len()) as i64);
            // computation_devices: one entry per computation (partition), listing the
            // device of each replica.
            let parts = da.first().map_or(0, |r| r.len());
            for p in 0..parts {
                let mut cd = Vec::new();
                for r in da {
                    int_field(&mut cd, 1, r[p]);
                }
                bytes_field(&mut m, 3, &cd);
            }
            bytes_field(&mut build, 9, &m);
        }
        let mut out = Vec::new();
        bytes_field(&mut out, 3, &build);
        if self.portable {
            int_field(&mut out, 4, 1);
        }
        out
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint field (wire type 0); negative values take ten bytes, as protobuf's int64.
fn int_field(out: &mut Vec<u8>, field: u32, v: i64) {
    varint(out, (field as u64) << 3);
    varint(out, v as u64);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, ((field as u64) << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_protobuf_wire_format() {
        let p = CompileOptions::portable().encode();
        // field 3 (len), then device_ordinal -1 as ten bytes, replicas 1, partitions 1;
        // then field 4 = 1.
        let build = [&[0x08][..], &[0xff; 9], &[0x01], &[0x20, 0x01, 0x28, 0x01]].concat();
        let want = [&[0x1a, build.len() as u8][..], &build, &[0x20, 0x01]].concat();
        assert_eq!(p, want);
        let r = CompileOptions::replicated(&[0, 1]).encode();
        // device_assignment: replica_count 2, computation_count 1, one computation
        // listing devices 0 and 1.
        let da = [0x08, 0x02, 0x10, 0x01, 0x1a, 0x04, 0x08, 0x00, 0x08, 0x01];
        assert!(r.windows(da.len() + 2).any(|w| w[0] == 0x4a && w[1] == da.len() as u8 && w[2..] == da));
    }
}

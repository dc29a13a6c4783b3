//! The CPU backend's devices are this host's cores: how many there are, how the ranks on
//! this host share them, and whether a mesh fits them.

use crate::cmd::error::CliResult;
use redco_core::runtime::Mesh;

/// Threads per rank when `total` threads (default: the host's cores) are shared by the
/// `ranks` ranks of `mesh` that run on this host (every rank for thread ranks; the host's
/// processes under a launcher).
pub fn threads_per_rank(total: Option<usize>, mesh: Mesh) -> usize {
    let mine = own_cores();
    if total.is_none() && super::launch::is_multi_process() && mine < host_cores() {
        // the launcher bound this process to its own cores: they are the rank's
        return mine;
    }
    let total = total.unwrap_or_else(host_cores);
    (total / super::launch::ranks_on_host(mesh)).max(1)
}

/// The cores this process may run on (its affinity mask).
fn own_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The host's online cores (`/sys/devices/system/cpu/online`), whatever this process's
/// affinity; at least this process's own.
pub fn host_cores() -> usize {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().map(|s| {
        s.trim()
            .split(',')
            .filter_map(|r| match r.split_once('-') {
                Some((a, b)) => Some(b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?),
                None => r.parse::<usize>().ok().map(|_| 1),
            })
            .sum::<usize>()
    });
    online.unwrap_or(0).max(own_cores())
}

/// The CPU backend's devices are its cores: a mesh with more ranks than cores is refused
/// unless `oversubscribe`.
pub fn check_devices(mesh: Mesh, threads: Option<usize>, oversubscribe: bool) -> CliResult<()> {
    let cores = threads.unwrap_or_else(host_cores);
    let here = super::launch::ranks_on_host(mesh);
    if here > cores && !oversubscribe {
        let w = super::launch::world();
        let whose = if w.size > 1 {
            format!("{here} ranks run on host {}", w.host)
        } else {
            format!("mesh {mesh} needs {here} devices")
        };
        let has = match threads {
            Some(t) => format!("{t} (--threads {t})"),
            None => format!("{cores} (cores)"),
        };
        return Err(format!("{whose} but the cpu backend has {has}; use a smaller mesh or --oversubscribe").into());
    }
    Ok(())
}

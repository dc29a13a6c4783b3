//! The `World`: who this process is among the processes of a job, read from its launcher.
//!
//! A rank that is a process learns its place from the program that started it: `mpirun` /
//! `srun --mpi=pmix` (MPI; the transport crate `redco-mpi` reads it through MPI itself) or
//! torchrun-style variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`), which the NCCL and PJRT bootstraps use. Without a launcher
//! the world is this one process, and every rank of a mesh is a thread in it.

use crate::{Error, Result};
use std::fmt;

/// What started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: a single process (thread ranks).
    None,
    /// An MPI launcher (`mpirun`, `mpiexec`, `srun --mpi=pmix`).
    Mpi,
    /// torchrun-style environment variables.
    Torchrun,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::None => "none",
            Launcher::Mpi => "mpi",
            Launcher::Torchrun => "torchrun",
        })
    }
}

/// This process's place in a job of processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    /// Global rank of this process (0-based).
    pub rank: usize,
    /// Number of processes in the job.
    pub size: usize,
    /// Rank of this process among the processes on its host.
    pub local_rank: usize,
    /// Number of processes on this host.
    pub local_size: usize,
    /// This host's name.
    pub host: String,
    /// What started the job.
    pub launcher: Launcher,
    /// `MASTER_ADDR:MASTER_PORT`, where the bootstrap store of rank 0 listens, when given.
    pub master: Option<String>,
}

impl World {
    /// The world of one process started without a launcher.
    pub fn single() -> World {
        World {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            host: hostname(),
            launcher: Launcher::None,
            master: None,
        }
    }

    /// Whether this process is global rank 0 (the one that logs, writes and reports).
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// The world described by torchrun-style variables (`RANK`, `WORLD_SIZE`, and
    /// optionally `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), read
    /// through `var`; `None` when `RANK` and `WORLD_SIZE` are absent. Inconsistent values
    /// are an error that names the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<World>> {
        let (Some(rank), Some(size)) = (var("RANK"), var("WORLD_SIZE")) else { return Ok(None) };
        let num = |name: &str, v: &str| -> Result<usize> {
            v.trim().parse().map_err(|_| Error::invalid("world", format!("{name}={v:?} is not a non-negative integer")))
        };
        let (rank, size) = (num("RANK", &rank)?, num("WORLD_SIZE", &size)?);
        let local_rank = var("LOCAL_RANK").map(|v| num("LOCAL_RANK", &v)).transpose()?.unwrap_or(rank);
        let local_size = var("LOCAL_WORLD_SIZE").map(|v| num("LOCAL_WORLD_SIZE", &v)).transpose()?.unwrap_or(size);
        if size == 0 || rank >= size {
            return Err(Error::invalid("world", format!("RANK={rank} is not below WORLD_SIZE={size}")));
        }
        if local_size == 0 || local_rank >= local_size || local_size > size {
            return Err(Error::invalid(
                "world",
                format!("LOCAL_RANK={local_rank} and LOCAL_WORLD_SIZE={local_size} do not fit WORLD_SIZE={size}"),
            ));
        }
        let master = match (var("MASTER_ADDR"), var("MASTER_PORT")) {
            (Some(a), Some(p)) => {
                num("MASTER_PORT", &p)?;
                Some(format!("{a}:{}", p.trim()))
            }
            (None, None) => None,
            (Some(_), None) => return Err(Error::invalid("world", "MASTER_ADDR is set but MASTER_PORT is not")),
            (None, Some(_)) => return Err(Error::invalid("world", "MASTER_PORT is set but MASTER_ADDR is not")),
        };
        Ok(Some(World { rank, size, local_rank, local_size, host: hostname(), launcher: Launcher::Torchrun, master }))
    }

    /// [`World::from_vars`] over the process environment.
    pub fn from_torchrun_env() -> Result<Option<World>> {
        World::from_vars(|k| std::env::var(k).ok())
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "process {} of {} (local {} of {} on {}), launcher {}",
            self.rank, self.size, self.local_rank, self.local_size, self.host, self.launcher
        )
    }
}

/// Which launcher the environment shows, from the variables each sets: Open MPI
/// (`OMPI_COMM_WORLD_SIZE`), MPICH / Intel MPI (`PMI_SIZE`), PMIx (`PMIX_RANK`) and Slurm's
/// `srun --mpi` (`SLURM_PROCID` with `PMI_*`/`PMIX_*`) count as MPI; `RANK` and
/// `WORLD_SIZE` as torchrun.
pub fn detect_launcher(var: impl Fn(&str) -> Option<String>) -> Launcher {
    let mpi = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"];
    if mpi.iter().any(|k| var(k).is_some()) {
        Launcher::Mpi
    } else if var("RANK").is_some() && var("WORLD_SIZE").is_some() {
        Launcher::Torchrun
    } else {
        Launcher::None
    }
}

/// [`detect_launcher`] over the process environment.
pub fn detect_launcher_env() -> Launcher {
    detect_launcher(|k| std::env::var(k).ok())
}

/// The number of processes an MPI launcher started, from its environment variables (Open
/// MPI, MPICH, PMIx under Slurm), when it says.
pub fn mpi_env_size(var: impl Fn(&str) -> Option<String>) -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"].iter().find_map(|k| var(k)?.trim().parse().ok())
}

/// This host's name (`/proc/sys/kernel/hostname`, then `HOSTNAME`, then `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(kv: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun_variables() {
        let w = World::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((w.rank, w.size, w.local_rank, w.local_size), (3, 8, 1, 2));
        assert_eq!(w.master.as_deref(), Some("node0:29500"));
        assert_eq!(w.launcher, Launcher::Torchrun);
        assert!(World::from_vars(vars(&[])).unwrap().is_none());
    }

    #[test]
    fn bad_torchrun_variables_are_named() {
        let e = World::from_vars(vars(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(e.contains("RANK=4") && e.contains("WORLD_SIZE=4"), "{e}");
        let e = World::from_vars(vars(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
        let e = World::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "a")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_PORT"), "{e}");
    }

    #[test]
    fn launchers_are_told_apart() {
        assert_eq!(detect_launcher(vars(&[("OMPI_COMM_WORLD_SIZE", "4")])), Launcher::Mpi);
        assert_eq!(detect_launcher(vars(&[("PMI_SIZE", "2")])), Launcher::Mpi);
        assert_eq!(detect_launcher(vars(&[("RANK", "0"), ("WORLD_SIZE", "2")])), Launcher::Torchrun);
        assert_eq!(detect_launcher(vars(&[])), Launcher::None);
        assert_eq!(mpi_env_size(vars(&[("OMPI_COMM_WORLD_SIZE", "4")])), Some(4));
    }
}

//! Starting a program under `mpirun` from Rust (tests, benchmarks, drivers): the flags for
//! one host with TCP between ranks (the path between hosts), a deadline after which the
//! job is killed, and the PIDs of its ranks (to kill or stop one).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A job started by [`Mpirun::spawn`].
pub struct Job {
    child: Child,
    started: Instant,
    out: PathBuf,
    err: PathBuf,
}

/// What a finished job left.
#[derive(Debug)]
pub struct Finished {
    /// mpirun's exit code (`None`: killed by a signal, e.g. at the deadline).
    pub code: Option<i32>,
    /// Whether the deadline passed and the job was killed.
    pub timed_out: bool,
    /// Standard output of every rank.
    pub stdout: String,
    /// Standard error of every rank and of mpirun.
    pub stderr: String,
    /// From start to exit.
    pub elapsed: Duration,
}

/// How to start `mpirun`.
#[derive(Debug, Clone)]
pub struct Mpirun {
    /// The launcher (`mpirun` on the `PATH` by default, or `REDCO_MPIRUN`).
    pub program: PathBuf,
    /// Processes.
    pub np: usize,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
}

impl Mpirun {
    /// `np` processes on this host, more than its cores allowed, TCP between them.
    pub fn new(np: usize) -> Self {
        let program = std::env::var_os("REDCO_MPIRUN").map(PathBuf::from).unwrap_or_else(|| "mpirun".into());
        Mpirun { program, np, env: Vec::new() }
    }

    /// Whether the launcher can be run at all.
    pub fn available(&self) -> bool {
        Command::new(&self.program).arg("--version").output().is_ok_and(|o| o.status.success())
    }

    /// Adds an environment variable for every rank.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Starts `exe args` on every rank; output goes to files under `dir`.
    pub fn spawn(&self, exe: &Path, args: &[&str], dir: &Path) -> std::io::Result<Job> {
        std::fs::create_dir_all(dir)?;
        let (out, err) = (dir.join("mpirun.out"), dir.join("mpirun.err"));
        let mut c = Command::new(&self.program);
        c.args(["--oversubscribe", "-np", &self.np.to_string(), "--mca", "btl", "tcp,self"]);
        for (k, v) in &self.env {
            c.args(["-x", &format!("{k}={v}")]);
        }
        c.arg(exe).args(args);
        // as root, Open MPI refuses to start without these
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        c.stdin(Stdio::null()).stdout(std::fs::File::create(&out)?).stderr(std::fs::File::create(&err)?);
        Ok(Job { child: c.spawn()?, started: Instant::now(), out, err })
    }

    /// [`Mpirun::spawn`] and [`Job::wait`].
    pub fn run(&self, exe: &Path, args: &[&str], dir: &Path, deadline: Duration) -> std::io::Result<Finished> {
        self.spawn(exe, args, dir)?.wait(deadline)
    }
}

impl Job {
    /// mpirun's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The PIDs of mpirun's children (the ranks on this host).
    pub fn rank_pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid == Some(self.pid()) {
                out.push(pid);
            }
        }
        out
    }

    /// Sends `signal` (e.g. `KILL`, `STOP`) to process `pid`.
    pub fn signal(pid: u32, signal: &str) -> std::io::Result<()> {
        let s = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status()?;
        if s.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill -{signal} {pid} failed")))
        }
    }

    /// The PID of the job's rank `rank` on this host (found by its `OMPI_COMM_WORLD_RANK`
    /// among mpirun's children), once it has started.
    pub fn rank_pid(&self, rank: usize) -> Option<u32> {
        let want = format!("OMPI_COMM_WORLD_RANK={rank}");
        self.rank_pids().into_iter().find(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            env.split(|&b| b == 0).any(|v| v == want.as_bytes())
        })
    }

    /// Waits up to `deadline` from the start; kills the job when it passes.
    pub fn wait(mut self, deadline: Duration) -> std::io::Result<Finished> {
        let mut timed_out = false;
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if self.started.elapsed() > deadline {
                timed_out = true;
                // the ranks first: a rank killed with mpirun would be left running
                for pid in self.rank_pids() {
                    let _ = Job::signal(pid, "KILL");
                }
                let _ = self.child.kill();
                break self.child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let elapsed = self.started.elapsed();
        // a rank that outlived mpirun (stopped, say) is ended too
        for pid in self.rank_pids() {
            let _ = Job::signal(pid, "KILL");
        }
        Ok(Finished {
            code: status.code(),
            timed_out,
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
            elapsed,
        })
    }
}

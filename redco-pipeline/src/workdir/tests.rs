use super::*;

fn fresh_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-workdir-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_lock_is_exclusive_between_runs_and_within_one() {
    let d = fresh_dir("lock");
    let held = WorkdirLock::acquire(&d).unwrap();
    // no second lock, from this process either: a run holds its one lock (its RunDir) and
    // hands it on; a clone of the handle shares it
    let shared = held.clone();
    let e = WorkdirLock::acquire(&d).unwrap_err().to_string();
    assert!(e.contains("in use") && e.contains(&format!("pid {}", std::process::id())), "{e}");
    // another open of the lock file, as another process would, cannot take it
    let other = File::options().read(true).write(true).open(d.join(LOCK_FILE)).unwrap();
    assert!(matches!(other.try_lock(), Err(fs::TryLockError::WouldBlock)));
    drop(held);
    assert!(matches!(other.try_lock(), Err(fs::TryLockError::WouldBlock)), "a clone keeps it");
    drop(shared);
    other.try_lock().unwrap();
    // and while another holds it, acquiring fails naming the workdir and the holder
    fs::write(d.join(LOCK_FILE), "pid 12345 on elsewhere").unwrap();
    let e = WorkdirLock::acquire(&d).unwrap_err().to_string();
    assert!(e.contains("in use") && e.contains("pid 12345") && e.contains(&d.display().to_string()), "{e}");
    drop(other);
    WorkdirLock::acquire(&d).unwrap();
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_earlier_run_is_kept_unless_overwrite_and_partial_checkpoints_go() {
    let d = fresh_dir("fresh");
    let ckpt = Checkpointer::new(&d, 2);
    prepare_fresh(&d, &ckpt, false).unwrap();
    fs::write(d.join("metrics.jsonl"), "{\"step\":1}\n").unwrap();
    fs::create_dir_all(ckpt.dir.join("step-00000003.tmp")).unwrap();
    let e = prepare_fresh(&d, &ckpt, false).unwrap_err().to_string();
    assert!(e.contains("earlier run") && e.contains("--overwrite"), "{e}");
    assert!(d.join("metrics.jsonl").exists(), "a refused run removes nothing");
    fs::create_dir_all(ckpt.dir.join("step-00000002")).unwrap();
    fs::write(ckpt.dir.join("step-00000002/manifest.json"), "{}").unwrap();
    let e = prepare_fresh(&d, &ckpt, false).unwrap_err().to_string();
    assert!(e.contains("checkpoints up to step 2"), "{e}");
    prepare_fresh(&d, &ckpt, true).unwrap();
    assert!(!d.join("metrics.jsonl").exists() && !ckpt.dir.exists());
    fs::create_dir_all(ckpt.dir.join("step-00000005.tmp")).unwrap();
    prepare_fresh(&d, &ckpt, false).unwrap();
    assert!(!ckpt.dir.join("step-00000005.tmp").exists(), "a partial checkpoint blocks nothing");
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_different_identity_is_refused_listing_every_difference() {
    let dir = Path::new("/w/checkpoints/step-00000010");
    let id = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let now = id(&[("seed", "42"), ("data", "a.jsonl"), ("vocab", "259")]);
    let recorded: BTreeMap<String, String> =
        identity_entries(&now).chain([("loss_scale".into(), "1".into())]).collect();
    check_identity(dir, &recorded, &now).unwrap();
    let other = id(&[("seed", "7"), ("data", "a.jsonl"), ("dtype", "bf16")]);
    let e = check_identity(dir, &recorded, &other).unwrap_err().to_string();
    for part in ["step-00000010", "seed was 42, is now 7", "dtype was not recorded", "vocab was 259, is now not given"]
    {
        assert!(e.contains(part), "{part}: {e}");
    }
    // a checkpoint from before identities were recorded resumes
    check_identity(dir, &BTreeMap::new(), &now).unwrap();
}

#[test]
fn metrics_are_cut_back_to_the_resumed_step() {
    let d = fresh_dir("metrics");
    let lines = "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}\n{\"step\":3,\"loss\":1.2}\n";
    fs::write(d.join("metrics.jsonl"), lines).unwrap();
    truncate_metrics(&d, 2).unwrap();
    assert_eq!(
        fs::read_to_string(d.join("metrics.jsonl")).unwrap(),
        "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}\n"
    );
    truncate_metrics(&d, 0).unwrap();
    assert_eq!(fs::read_to_string(d.join("metrics.jsonl")).unwrap(), "");
    let left: Vec<_> = fs::read_dir(&d).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "no temporary files left: {left:?}");
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_io_failure_keeps_its_kind_path_and_os_error() {
    let d = fresh_dir("io-kind");
    // a workdir under a regular file cannot be created
    fs::write(d.join("file"), "not a directory").unwrap();
    let under = d.join("file").join("run");
    let e = WorkdirLock::acquire(&under).unwrap_err();
    match &e {
        Error::Io { op, what, path, source } => {
            assert_eq!((*op, what.as_str(), path.as_path()), ("workdir", "cannot create", under.as_path()));
            assert_eq!(e.io_kind(), Some(source.kind()));
        }
        other => panic!("expected Error::Io, got {other:?}"),
    }
    // the message reads as before: component, what, path, OS error
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("workdir: cannot create {}: ", under.display())), "{msg}");
    // a caller can walk to the OS error through `source()`
    assert!(std::error::Error::source(&e).is_some());
    assert_eq!(Error::invalid("x", "y").io_kind(), None);
}

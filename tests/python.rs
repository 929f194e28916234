//! The Python package's test suite (`python/tests/`, pytest) against real daemons.
//!
//! Runs when `python3` (or `$PYO3_PYTHON`) has pytest and numpy; otherwise prints a skip
//! line and passes, unless `SKYRIVER_REQUIRE_PYTHON=1` (CI), where a missing prerequisite
//! fails. The extension is the workspace's `skyriver-python` cdylib, built by cargo (the
//! same interpreter found it at build time); it is copied with the package's Python sources
//! into a temporary directory, so nothing is written into the source tree.
//!
//! With `SKYRIVER_PYTHON_SUITE=installed` (CI, after installing the wheel) the suite runs
//! against the package installed in that interpreter instead, daemons included (its
//! `skyriver` command, first on PATH): nothing is built or copied but the tests.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> String {
    std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether the suite runs against the installed package rather than this build.
fn against_installed_package() -> bool {
    std::env::var("SKYRIVER_PYTHON_SUITE").is_ok_and(|v| v == "installed")
}

/// Why the suite cannot run here, if it cannot.
fn missing_prerequisite(python: &str) -> Option<String> {
    let probe = Command::new(python)
        .args(["-c", "import pytest, numpy"])
        .output();
    match probe {
        Err(error) => Some(format!("cannot run {python}: {error}")),
        Ok(output) if !output.status.success() => Some(format!(
            "{python} lacks pytest or numpy: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        )),
        Ok(_) => None,
    }
}

/// Builds the extension with cargo (a no-op when up to date) and returns its path.
fn build_extension() -> PathBuf {
    let target_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .expect("test binaries live in <target>/<profile>/deps");
    let profile_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let release = profile_dir
        .file_name()
        .is_some_and(|name| name == "release");
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "-p", "skyriver-python"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build -p skyriver-python");
    assert!(status.success(), "building the Python extension failed");
    let library = profile_dir.join("lib_native.so");
    assert!(library.exists(), "{} was not built", library.display());
    library
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        if name_text == "__pycache__"
            || name_text.starts_with("_native") && name_text.ends_with(".so")
        {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

#[test]
fn python_package_test_suite() {
    let python = python();
    let test = "python_package_test_suite";
    if let Some(reason) = missing_prerequisite(&python) {
        common::skip::skip(test, &common::skip::PYTHON, &reason);
        return;
    }
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let staging = tempfile::Builder::new()
        .prefix("skyriver-python-test")
        .tempdir()
        .unwrap();
    copy_dir(&sources.join("tests"), &staging.path().join("tests"));
    let mut pytest = Command::new(&python);
    // `-rs` lists each pytest skip with its reason, as `SKIPPED [n] file:line: reason`.
    pytest
        .args([
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests",
        ])
        .current_dir(staging.path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stderr(std::process::Stdio::inherit());
    if against_installed_package() {
        // The installed package, and its `skyriver` command for the daemons.
        pytest.env_remove("PYTHONPATH").env_remove("SKYRIVER_BIN");
    } else {
        let library = build_extension();
        copy_dir(&sources.join("skyriver"), &staging.path().join("skyriver"));
        std::fs::copy(&library, staging.path().join("skyriver").join("_native.so")).unwrap();
        pytest
            .env("PYTHONPATH", staging.path())
            .env("SKYRIVER_BIN", env!("CARGO_BIN_EXE_skyriver"));
    }
    let output = pytest.output().expect("run pytest");
    // Shown as pytest prints it (past the harness's capture, like a child's stderr).
    let _ = std::io::stdout().write_all(&output.stdout);
    let report = String::from_utf8_lossy(&output.stdout);
    for skipped in report.lines().filter_map(|l| l.strip_prefix("SKIPPED ")) {
        // `[n] tests/test_arrow.py:10: could not import 'pyarrow'`: a whole pytest test (or
        // n of them) that did not run, reported like any other skip.
        let (place, reason) = skipped.split_once(": ").unwrap_or((skipped, "skipped"));
        common::skip::skip(&format!("{test} {place}"), &common::skip::PYTHON, reason);
    }
    assert!(
        output.status.success(),
        "the Python test suite failed ({})",
        output.status
    );
}

//! Why a daemon could not start, as values a caller can match on: the memory it cannot have,
//! the fabric or the directory it could not start or reach, each with its cause kept as the
//! error's source. And its configuration, printed with `{:?}`, never shows the cluster token.

mod common;

use std::error::Error as _;

use skyriver_daemon::host_memory::MemoryError;
use skyriver_daemon::security::ClusterToken;
use skyriver_daemon::{
    ClusterConfig, DaemonConfig, DaemonError, DaemonHandle, DirectoryChoice, DirectoryStartError,
    FabricChoice, FabricStartError,
};
use skyriver_transport::directory::DirectoryError;

const SECRET: &str = "do-not-print-this-token";

fn config(dir: &std::path::Path, fabric: FabricChoice, directory: DirectoryChoice) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir.join("daemon.sock"), 16 << 20);
    config.prefault = false;
    config.cluster = Some(ClusterConfig {
        fabric,
        listen: "127.0.0.1:0".parse().unwrap(),
        directory,
        cluster_name: "default".into(),
        cluster_token: ClusterToken::new(SECRET),
        advertise: None,
        join_timeout: std::time::Duration::ZERO,
        learn_locations: false,
    });
    config
}

/// A loopback address nothing listens on: bound, then closed.
fn refusing_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[test]
fn a_config_printed_with_debug_never_shows_the_token() {
    let dir = common::test_dir();
    let config = config(
        dir.path(),
        FabricChoice::Tcp,
        DirectoryChoice::Head {
            listen: "127.0.0.1:0".parse().unwrap(),
        },
    );
    for printed in [format!("{config:?}"), format!("{config:#?}")] {
        assert!(!printed.contains(SECRET), "{printed}");
        assert!(printed.contains("ClusterToken(***)"), "{printed}");
    }
}

#[test]
fn too_little_memory_is_a_memory_error() {
    let dir = common::test_dir();
    let config = DaemonConfig::new(dir.path().join("daemon.sock"), 1);
    match DaemonHandle::start(config) {
        Err(DaemonError::Memory(MemoryError::TooSmall { asked_bytes: 1 })) => {}
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a daemon of 1 byte started"),
    }
}

#[test]
fn a_directory_nobody_serves_is_a_directory_error_with_its_cause() {
    let dir = common::test_dir();
    let head = refusing_address();
    let config = config(
        dir.path(),
        FabricChoice::Tcp,
        DirectoryChoice::Join { head: head.clone() },
    );
    let Err(error) = DaemonHandle::start(config) else {
        panic!("joined a directory nobody serves");
    };
    assert!(
        matches!(
            error,
            DaemonError::Directory(DirectoryStartError::Join(
                DirectoryError::Unreachable { .. }
            ))
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains(&head), "{error}");
    assert!(error.source().is_some(), "the cause is kept: {error:?}");
}

#[test]
fn a_head_port_in_use_is_a_directory_bind_error() {
    let dir = common::test_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap();
    let config = config(
        dir.path(),
        FabricChoice::Tcp,
        DirectoryChoice::Head { listen },
    );
    match DaemonHandle::start(config) {
        Err(DaemonError::Directory(DirectoryStartError::Bind { addr, source })) => {
            assert_eq!(addr, listen);
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("served the directory on a port in use"),
    }
}

#[test]
fn a_missing_rdma_device_is_a_fabric_error_with_its_cause() {
    let dir = common::test_dir();
    let fabric = FabricChoice::Verbs {
        device: "skyriver_no_such_device".into(),
        port: 1,
        gid_index: None,
        memory_windows: false,
    };
    let config = config(
        dir.path(),
        fabric,
        DirectoryChoice::Head {
            listen: "127.0.0.1:0".parse().unwrap(),
        },
    );
    let Err(error) = DaemonHandle::start(config) else {
        panic!("a verbs fabric started on a device that does not exist");
    };
    assert!(
        matches!(error, DaemonError::Fabric(FabricStartError::Verbs(_))),
        "{error:?}"
    );
    assert!(error.to_string().contains("--fabric tcp"), "{error}");
    let fabric = error.source().expect("the fabric error is kept");
    assert!(
        fabric.source().is_some(),
        "the verbs error is kept: {error:?}"
    );
}

/// A daemon started before its head (every daemon of a job starts at once, or the head is
/// restarting) keeps trying for its `join_timeout` and joins once the head serves.
#[test]
fn a_daemon_started_before_its_head_joins_once_the_head_serves() {
    use std::time::{Duration, Instant};
    let dir = common::test_dir();
    // The head's address, held by a listener that turns the first attempt away.
    let early = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let head_addr = early.local_addr().unwrap();
    let mut joining = config(
        &dir.path().join("joining"),
        FabricChoice::Tcp,
        DirectoryChoice::Join {
            head: head_addr.to_string(),
        },
    );
    joining.node = skyriver_core::NodeId(1);
    joining.cluster.as_mut().unwrap().join_timeout = Duration::from_secs(60);
    std::fs::create_dir_all(dir.path().join("joining")).unwrap();
    let joiner = std::thread::spawn(move || DaemonHandle::start(joining));

    // Its first attempt arrives and is closed unanswered: the head is not up yet.
    early.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match early.accept() {
            Ok((attempt, _)) => {
                drop(attempt);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the daemon never tried to join");
                assert!(!joiner.is_finished(), "the daemon gave up before trying");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(early);

    let head = DaemonHandle::start(config(
        dir.path(),
        FabricChoice::Tcp,
        DirectoryChoice::Head { listen: head_addr },
    ))
    .expect("the head starts on its address");
    let joined = joiner.join().expect("the joining thread");
    let joined = joined.expect("the daemon joined once the head served");
    joined.stop();
    head.stop();
}

//! Traceable transfers: with `RUST_LOG=skyriver=debug`-style logging and `--log-format json`
//! on two nodes, one fetch's id appears in the requester's and the holder's log lines.

mod common;

use std::path::Path;
use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ObjectId, TransferMode};

/// The JSON log lines of a node whose span is a fetch, as (fetch id, message).
fn fetch_lines(log: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap();
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["span"]["name"] == "fetch")
        .map(|line| {
            (
                line["span"]["id"].as_str().unwrap_or_default().to_string(),
                line["fields"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn one_fetch_id_appears_in_both_nodes_json_logs() {
    let dir = common::test_dir();
    let mut args = UpArgs::new(2, "64MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.log = "warn,skyriver=debug".into();
    args.daemon_args = vec!["--log-format".into(), "json".into()];
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    let timeout = Some(Duration::from_secs(30));
    for (n, (size, mode)) in [
        (100, TransferMode::Eager),
        (1 << 20, TransferMode::Rendezvous),
    ]
    .into_iter()
    .enumerate()
    {
        let id = ObjectId::from_u64(40 + n as u64);
        holder.create_and_seal(id, &vec![3; size], b"").unwrap();
        requester.fetch_one_in_mode(id, timeout, mode).unwrap();
    }
    let log = |node: usize| dir.path().join(format!("node-{node}.log"));
    let mut requester_lines = Vec::new();
    let mut holder_lines = Vec::new();
    common::eventually("both nodes logged both fetches", || {
        requester_lines = fetch_lines(&log(1));
        holder_lines = fetch_lines(&log(0));
        requester_lines
            .iter()
            .filter(|(_, m)| m == "fetched object sealed")
            .count()
            == 2
            && holder_lines.len() >= 2
    });
    for wanted in [
        "serving eagerly",
        "serving by rendezvous: object pinned, READ access granted",
    ] {
        let (id, _) = holder_lines
            .iter()
            .find(|(_, m)| m == wanted)
            .unwrap_or_else(|| panic!("holder never logged {wanted:?}: {holder_lines:?}"));
        assert!(
            id.starts_with("node-1/"),
            "the requester names the fetch: {id}"
        );
        let requester_messages: Vec<&str> = requester_lines
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, m)| m.as_str())
            .collect();
        assert!(
            requester_messages.contains(&"fetch requested")
                && requester_messages.contains(&"fetched object sealed"),
            "fetch {id}: requester logged {requester_messages:?}"
        );
    }
}

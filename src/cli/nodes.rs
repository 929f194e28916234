//! `skyriver nodes`: the cluster's members.

#[allow(unused_imports)]
use super::*;

pub(super) fn nodes(socket: &SocketArg, json: bool) -> Result<(), CliError> {
    let client = socket.connect()?;
    let view = client.nodes()?;
    if json {
        let members: Vec<serde_json::Value> = view
            .members
            .iter()
            .map(|m| {
                serde_json::json!({
                    "node": m.node.0, "address": m.address, "fabric": m.fabric,
                    "connected": m.connected, "eager_threshold_bytes": m.eager_threshold_bytes, "link": m.link,
                    "failure_domain": m.failure_domain,
                })
            })
            .collect();
        let document = serde_json::json!({
            "node": view.node.0, "fabric": view.fabric, "directory": view.directory,
            "directory_healthy": view.directory_healthy, "members": members,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&document).expect("JSON values serialize")
        );
        return Ok(());
    }
    println!(
        "this node: {}, fabric {}, directory {}{}",
        view.node,
        view.fabric,
        view.directory,
        if view.directory_healthy {
            ""
        } else {
            " (UNREACHABLE)"
        }
    );
    println!(
        "{:<10} {:<22} {:<7} {:<10} {:<12} LINK",
        "NODE", "ADDRESS", "FABRIC", "CONNECTED", "DOMAIN"
    );
    for m in &view.members {
        println!(
            "{:<10} {:<22} {:<7} {:<10} {:<12} {}",
            m.node.to_string(),
            m.address,
            m.fabric,
            if m.connected { "yes" } else { "no" },
            if m.failure_domain.is_empty() {
                "-"
            } else {
                &m.failure_domain
            },
            m.link
        );
    }
    Ok(())
}

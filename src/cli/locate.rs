//! `skyriver locate`: where an object lives: every copy, with its node's failure domain, and
//! whether it is a copy of record (counted toward the copies the object wants, never evicted)
//! or a cache copy (evictable).

#[allow(unused_imports)]
use super::*;

use skyriver_client::ObjectCopies;

pub(super) fn locate(socket: &SocketArg, id: ObjectId, json: bool) -> Result<(), CliError> {
    let client = socket.connect()?;
    let skyriver_client::ObjectLocation { digest, .. } = client.locate(id)?;
    let copies = client.locate_copies(id)?;
    if copies.copies.is_empty() {
        return Err(CliError::NotHeld(id));
    }
    let digest = digest.map(|d| d.to_string());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&locate_json(id, digest.as_deref(), &copies))
                .expect("JSON values serialize")
        );
    } else {
        for line in locate_lines(id, digest.as_deref(), &copies) {
            println!("{line}");
        }
    }
    Ok(())
}

/// What a copy is, as printed: `record` or `cache`, or `None` when the directory keeps no
/// records.
fn kind(copies: &ObjectCopies, of_record: bool) -> Option<&'static str> {
    copies
        .records_known
        .then_some(if of_record { "record" } else { "cache" })
}

/// The text `locate` prints: a line for the object, one for each copy.
fn locate_lines(id: ObjectId, digest: Option<&str>, copies: &ObjectCopies) -> Vec<String> {
    let digest = digest.map_or_else(String::new, |d| format!("  digest {d}"));
    let of_record = copies.copies.iter().filter(|c| c.of_record).count();
    let record = match (copies.records_known, copies.wanted) {
        (true, Some(k)) => format!("  {of_record} of {k} copies of record"),
        (true, None) => "  no copies of record (put with one copy)".to_string(),
        (false, Some(k)) => format!("  wants {k} copies"),
        (false, None) => String::new(),
    };
    let mut lines = vec![match copies.sizes {
        Some((data, metadata)) => format!(
            "{id}  {} + {} metadata{digest}{record}",
            format_bytes(data),
            format_bytes(metadata),
        ),
        None => format!("{id}{digest}{record}"),
    }];
    for copy in &copies.copies {
        let domain = if copy.failure_domain.is_empty() {
            "-"
        } else {
            &copy.failure_domain
        };
        let kind = kind(copies, copy.of_record).map_or_else(String::new, |k| format!("  {k}"));
        lines.push(format!("  {}  domain {domain}{kind}", copy.node));
    }
    if !copies.records_known {
        lines.push(
            "  record or cache unknown: the directory is Redis, which keeps no copies of record"
                .to_string(),
        );
    }
    lines
}

/// The document `locate --json` prints.
fn locate_json(id: ObjectId, digest: Option<&str>, copies: &ObjectCopies) -> serde_json::Value {
    let list: Vec<serde_json::Value> = copies
        .copies
        .iter()
        .map(|copy| {
            serde_json::json!({
                "node": copy.node.0,
                "failure_domain": copy.failure_domain,
                "of_record": copies.records_known.then_some(copy.of_record),
            })
        })
        .collect();
    serde_json::json!({
        "id": id.to_string(),
        "data_bytes": copies.sizes.map(|(data, _)| data),
        "metadata_bytes": copies.sizes.map(|(_, metadata)| metadata),
        "digest": digest,
        "wanted": copies.wanted,
        "records_known": copies.records_known,
        "copies_of_record": copies
            .records_known
            .then(|| copies.copies.iter().filter(|c| c.of_record).count()),
        "copies": list,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_client::{CopyView, NodeId};

    fn copy(node: u32, domain: &str, of_record: bool) -> CopyView {
        CopyView {
            node: NodeId(node),
            failure_domain: domain.to_string(),
            of_record,
        }
    }

    fn under_replicated() -> ObjectCopies {
        ObjectCopies {
            copies: vec![copy(1, "a", true), copy(2, "b", false), copy(3, "", false)],
            wanted: Some(2),
            sizes: None,
            records_known: true,
        }
    }

    #[test]
    fn an_under_replicated_object_with_cache_copies_shows_one_of_two_of_record() {
        let id = ObjectId::from_u64(7);
        let lines = locate_lines(id, None, &under_replicated());
        assert_eq!(
            lines,
            [
                format!("{id}  1 of 2 copies of record"),
                format!("  {}  domain a  record", NodeId(1)),
                format!("  {}  domain b  cache", NodeId(2)),
                format!("  {}  domain -  cache", NodeId(3)),
            ]
        );
        let json = locate_json(id, Some("d"), &under_replicated());
        assert_eq!(json["wanted"], 2);
        assert_eq!(json["copies_of_record"], 1);
        assert_eq!(json["copies"][0]["of_record"], true);
        assert_eq!(json["copies"][1]["of_record"], false);
    }

    #[test]
    fn without_records_redis_is_named_and_no_copy_is_marked() {
        let id = ObjectId::from_u64(7);
        let copies = ObjectCopies {
            copies: vec![copy(1, "a", false)],
            wanted: Some(2),
            sizes: None,
            records_known: false,
        };
        let lines = locate_lines(id, None, &copies);
        assert_eq!(lines[0], format!("{id}  wants 2 copies"));
        assert_eq!(lines[1], format!("  {}  domain a", NodeId(1)));
        assert!(lines[2].contains("Redis"), "{lines:?}");
        let json = locate_json(id, None, &copies);
        assert_eq!(json["records_known"], false);
        assert!(json["copies_of_record"].is_null());
        assert!(json["copies"][0]["of_record"].is_null());
    }
}

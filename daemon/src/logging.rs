//! Log filters given on the command line (`--log`) or in `RUST_LOG`, checked before use: a
//! misspelt level would otherwise be read as a target name and silence every log line.

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the current span's fields (e.g. a fetch's id).
    Json,
}

/// Parses `--metrics`: `HOST:PORT`, or a bare port (then on loopback, safe by default).
pub fn parse_metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|_| {
        format!("{text:?} is not an address: expected HOST:PORT (e.g. 127.0.0.1:9464) or a port")
    })
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a filter: comma-separated directives, each a level (`info`) or `TARGET=LEVEL`
/// (`skyriver_daemon=debug`, `skyriver_transport::fabric=trace`). Returns it unchanged when valid.
pub fn parse_filter(text: &str) -> Result<String, String> {
    let hint = "expected a level (off, error, warn, info, debug, trace) or TARGET=LEVEL, \
                comma-separated, e.g. info or warn,skyriver=debug";
    if text.trim().is_empty() {
        return Err(format!("empty log filter: {hint}"));
    }
    for directive in text.split(',').map(str::trim) {
        let level = match directive.split_once('=') {
            Some((target, level)) => {
                let target_ok = !target.is_empty()
                    && target
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_:-".contains(c));
                if !target_ok {
                    return Err(format!("bad target {target:?} in {directive:?}: {hint}"));
                }
                level
            }
            None => directive,
        };
        if !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
            let close = LEVELS
                .iter()
                .find(|l| l.starts_with(&level.to_ascii_lowercase()[..level.len().min(3)]))
                .map(|l| format!(" (did you mean {l}?)"))
                .unwrap_or_default();
            return Err(format!("unknown log level {level:?}{close}: {hint}"));
        }
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::parse_filter;

    #[test]
    fn levels_and_target_directives_pass() {
        for ok in [
            "info",
            "WARN",
            "warn,skyriver=debug",
            "skyriver::daemon=trace",
            "off",
        ] {
            assert_eq!(parse_filter(ok).as_deref(), Ok(ok));
        }
    }

    #[test]
    fn misspelt_levels_are_refused_with_a_hint() {
        let e = parse_filter("inf").unwrap_err();
        assert!(e.contains("did you mean info?"), "{e}");
        let e = parse_filter("warning").unwrap_err();
        assert!(e.contains("did you mean warn?"), "{e}");
        assert!(parse_filter("bogus").is_err());
        assert!(parse_filter("skyriver=loud").is_err());
        assert!(parse_filter("").is_err());
        assert!(parse_filter("=info").is_err());
    }
}

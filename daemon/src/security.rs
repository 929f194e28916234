//! Safe defaults of a cluster daemon: where the cluster token comes from, which addresses a
//! daemon may listen on without one, and which fabric address it publishes for peers to dial.
//!
//! Without a token a daemon is reachable from this host only: its fabric and its built-in
//! directory listen on loopback. Listening on other addresses needs a token (`--token`,
//! `SKYRIVER_CLUSTER_TOKEN` or a `--token-file` only its owner can read) or an explicit
//! `--insecure`.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use skyriver_transport::token::ClusterToken;
use zeroize::Zeroizing;

/// The token an `--insecure` daemon without a token uses (every such daemon shares it, so it
/// keeps out nobody).
pub const INSECURE_DEFAULT_TOKEN: &str = "skyriver-default-token";

/// Longest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// Why the daemon's security settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// Both a token and a token file were given.
    #[error(
        "both a token (--token or SKYRIVER_CLUSTER_TOKEN) and --token-file are given; pass one"
    )]
    TwoTokens,
    /// The token file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    ReadTokenFile {
        /// The file.
        path: PathBuf,
        /// From `open`/`read`.
        #[source]
        source: std::io::Error,
    },
    /// Others than its owner may read or write the token file.
    #[error(
        "the token file {path} has mode {mode:04o}: others than its owner may read it; \
         `chmod 600 {path}` and start again"
    )]
    TokenFileOpen {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The token (or the token file) is empty.
    #[error("the cluster token is empty")]
    EmptyToken,
    /// The token file is over the limit.
    #[error("the token file {path} is over {MAX_TOKEN_FILE_BYTES} bytes")]
    TokenFileTooLong {
        /// The file.
        path: String,
    },
    /// A non-loopback address without a token or `--insecure`.
    #[error(
        "{what} {addr} is reachable from other hosts, which needs a cluster token: pass \
         --token-file PATH (mode 0600), --token or SKYRIVER_CLUSTER_TOKEN (the same on every \
         node), or --insecure to accept any peer"
    )]
    NeedsToken {
        /// Which listener (`--listen`, `--head`).
        what: &'static str,
        /// The address asked for.
        addr: SocketAddr,
    },
    /// `--socket-group` names no group.
    #[error("--socket-group {0}: no such group (see /etc/group or `getent group`)")]
    NoSuchGroup(String),
    /// No concrete address to publish for a fabric listening on an unspecified address.
    #[error(
        "the fabric listens on {listen}, an address peers cannot dial, and no route gives one \
         to publish: pass --advertise IP or a concrete --listen IP:PORT"
    )]
    NoAdvertiseAddress {
        /// The listen address.
        listen: SocketAddr,
    },
}

/// Where this daemon's token comes from. `Debug` shows a set token as `ClusterToken(***)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenChoice {
    /// A token the operator set: other hosts may join.
    Set(ClusterToken),
    /// No token and `--insecure`: everybody shares [`INSECURE_DEFAULT_TOKEN`].
    Insecure,
    /// No token: loopback only.
    LoopbackOnly,
}

impl TokenChoice {
    /// The token to present to peers (shared, not copied: see [`ClusterToken`]).
    pub fn token(&self) -> ClusterToken {
        match self {
            TokenChoice::Set(token) => token.clone(),
            TokenChoice::Insecure | TokenChoice::LoopbackOnly => {
                ClusterToken::new(INSECURE_DEFAULT_TOKEN)
            }
        }
    }
}

/// Chooses the token from `--token`/`SKYRIVER_CLUSTER_TOKEN`, `--token-file` and `--insecure`.
/// A given token wins over `--insecure`.
pub fn choose_token(
    token: Option<ClusterToken>,
    token_file: Option<&Path>,
    insecure: bool,
) -> Result<TokenChoice, SecurityError> {
    let token = match (token, token_file) {
        (Some(_), Some(_)) => return Err(SecurityError::TwoTokens),
        (Some(token), None) => Some(token),
        (None, Some(path)) => Some(read_token_file(path)?),
        (None, None) => None,
    };
    match token {
        Some(token) if token.expose_secret().is_empty() => Err(SecurityError::EmptyToken),
        Some(token) => Ok(TokenChoice::Set(token)),
        None if insecure => Ok(TokenChoice::Insecure),
        None => Ok(TokenChoice::LoopbackOnly),
    }
}

/// Parses `--token` (or `SKYRIVER_CLUSTER_TOKEN`) straight into a [`ClusterToken`], as the
/// command line's value parser: the secret never sits in a `String` of the parsed arguments.
pub fn parse_token(text: &str) -> Result<ClusterToken, SecurityError> {
    if text.is_empty() {
        return Err(SecurityError::EmptyToken);
    }
    Ok(ClusterToken::new(text))
}

/// Reads a token file: only its owner may read or write it (mode 0600 or stricter); the
/// token is its content without the trailing line break. What was read is zeroed.
pub fn read_token_file(path: &Path) -> Result<ClusterToken, SecurityError> {
    let read_error = |source| SecurityError::ReadTokenFile {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mode = file.metadata().map_err(read_error)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecurityError::TokenFileOpen {
            path: path.display().to_string(),
            mode,
        });
    }
    // Room for the whole read up front: a buffer that grew would leave copies behind.
    let mut text = Zeroizing::new(String::with_capacity(MAX_TOKEN_FILE_BYTES as usize + 1));
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(SecurityError::TokenFileTooLong {
            path: path.display().to_string(),
        });
    }
    let line_break = text.trim_end_matches(['\n', '\r']).len();
    text.truncate(line_break);
    if text.is_empty() {
        return Err(SecurityError::EmptyToken);
    }
    Ok(ClusterToken::new(std::mem::take(&mut *text)))
}

/// The address to listen on, given the token choice: without a token an unspecified address
/// (`0.0.0.0`, `::`) becomes loopback with the same port, and any other non-loopback address
/// is refused.
pub fn listen_address(
    what: &'static str,
    asked: SocketAddr,
    choice: &TokenChoice,
) -> Result<SocketAddr, SecurityError> {
    if *choice != TokenChoice::LoopbackOnly || asked.ip().is_loopback() {
        return Ok(asked);
    }
    match asked.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), asked.port()))
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            Ok(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), asked.port()))
        }
        _ => Err(SecurityError::NeedsToken { what, addr: asked }),
    }
}

/// The fabric address peers dial: `listen` itself when it is concrete; for an unspecified
/// listen address `advertise`, else the source address of the route towards `toward` (the
/// directory), else that of the default route. Never an unspecified address.
pub fn advertised_address(
    listen: SocketAddr,
    advertise: Option<IpAddr>,
    toward: Option<&str>,
) -> Result<SocketAddr, SecurityError> {
    if let Some(ip) = advertise {
        return Ok(SocketAddr::new(ip, listen.port()));
    }
    if !listen.ip().is_unspecified() {
        return Ok(listen);
    }
    let v6 = listen.is_ipv6();
    let targets = toward
        .and_then(|host_port| host_port.to_socket_addrs().ok())
        .into_iter()
        .flatten()
        .filter(|addr| addr.is_ipv6() == v6 && !addr.ip().is_unspecified())
        .chain(std::iter::once(match v6 {
            // Documentation prefixes: only the routing table is consulted, nothing is sent.
            false => SocketAddr::from(([192, 0, 2, 1], 9)),
            true => SocketAddr::from(([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1], 9)),
        }));
    for target in targets {
        if let Some(ip) = route_source(target) {
            return Ok(SocketAddr::new(ip, listen.port()));
        }
    }
    Err(SecurityError::NoAdvertiseAddress { listen })
}

/// The local address the kernel picks to reach `target` (a UDP `connect` sends nothing).
fn route_source(target: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// The id of group `name` (a name, or a number).
pub fn group_id(name: &str) -> Result<u32, SecurityError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        _ => Err(SecurityError::NoSuchGroup(name.to_string())),
    }
}

/// A fresh random token (32 hex digits from the operating system's generator).
pub fn random_token() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(mode: u32, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn a_token_file_readable_by_others_is_refused_with_the_fix() {
        let (_dir, path) = file_with(0o644, "secret\n");
        let e = read_token_file(&path).unwrap_err().to_string();
        assert!(e.contains("0644") && e.contains("chmod 600"), "{e}");
        let (_dir, path) = file_with(0o640, "secret\n");
        assert!(read_token_file(&path).is_err());
    }

    #[test]
    fn an_owner_only_token_file_gives_its_first_line_without_the_break() {
        let (_dir, path) = file_with(0o600, "secret\n");
        assert_eq!(read_token_file(&path).unwrap().expose_secret(), "secret");
        let (_dir, path) = file_with(0o400, "s3\r\n");
        assert_eq!(read_token_file(&path).unwrap().expose_secret(), "s3");
        let (_dir, path) = file_with(0o600, "\n");
        assert!(matches!(
            read_token_file(&path),
            Err(SecurityError::EmptyToken)
        ));
    }

    #[test]
    fn the_token_choice_follows_the_flags() {
        assert_eq!(
            choose_token(None, None, false).unwrap(),
            TokenChoice::LoopbackOnly
        );
        assert_eq!(
            choose_token(None, None, true).unwrap(),
            TokenChoice::Insecure
        );
        assert_eq!(
            choose_token(Some("t".into()), None, true).unwrap(),
            TokenChoice::Set("t".into())
        );
        let (_dir, path) = file_with(0o600, "f");
        assert!(matches!(
            choose_token(Some("t".into()), Some(&path), false),
            Err(SecurityError::TwoTokens)
        ));
        assert!(matches!(
            choose_token(Some("".into()), None, false),
            Err(SecurityError::EmptyToken)
        ));
        assert_eq!(
            format!("{:?}", TokenChoice::Set("hush".into())),
            "Set(ClusterToken(***))"
        );
    }

    #[test]
    fn without_a_token_only_loopback_is_listened_on() {
        let none = TokenChoice::LoopbackOnly;
        let any: SocketAddr = "0.0.0.0:7390".parse().unwrap();
        assert_eq!(
            listen_address("--head", any, &none).unwrap(),
            "127.0.0.1:7390".parse().unwrap()
        );
        let any6: SocketAddr = "[::]:0".parse().unwrap();
        assert_eq!(
            listen_address("--listen", any6, &none).unwrap(),
            "[::1]:0".parse().unwrap()
        );
        let public: SocketAddr = "10.1.2.3:7000".parse().unwrap();
        let e = listen_address("--listen", public, &none)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--token-file") && e.contains("--insecure"),
            "{e}"
        );
        for choice in [TokenChoice::Insecure, TokenChoice::Set("t".into())] {
            assert_eq!(listen_address("--listen", public, &choice).unwrap(), public);
            assert_eq!(listen_address("--listen", any, &choice).unwrap(), any);
        }
    }

    #[test]
    fn an_unspecified_listen_address_is_never_published() {
        let listen: SocketAddr = "0.0.0.0:7001".parse().unwrap();
        let toward_loopback = advertised_address(listen, None, Some("127.0.0.1:7390")).unwrap();
        assert_eq!(toward_loopback, "127.0.0.1:7001".parse().unwrap());
        let given = advertised_address(listen, Some("10.9.8.7".parse().unwrap()), None).unwrap();
        assert_eq!(given, "10.9.8.7:7001".parse().unwrap());
        let concrete: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        assert_eq!(advertised_address(concrete, None, None).unwrap(), concrete);
        // Whatever the host's routes, the answer is concrete or a refusal naming the fix.
        match advertised_address(listen, None, None) {
            Ok(addr) => assert!(!addr.ip().is_unspecified()),
            Err(e) => assert!(e.to_string().contains("--advertise")),
        }
    }

    #[test]
    fn random_tokens_differ() {
        let (a, b) = (random_token(), random_token());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}

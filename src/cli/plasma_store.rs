//! `skyriver plasma_store` (and `plasma_store`): the daemon under plasma_store's flags.

#[allow(unused_imports)]
use super::*;

/// plasma_store's flags: `-h` means huge pages here, as in plasma_store; `--help` prints help.
#[derive(Args)]
#[command(disable_help_flag = true)]
pub(super) struct PlasmaStoreArgs {
    /// Shared memory for objects, in bytes (or a size such as 4GiB).
    #[arg(short = 'm', value_name = "BYTES")]
    pub(super) memory: ByteSize,
    /// The Unix socket to serve clients on.
    #[arg(short = 's', value_name = "SOCKET")]
    pub(super) socket: PathBuf,
    /// With -h, the hugetlbfs mount to back the store with (as `skyriver daemon --hugepages
    /// DIR`); without -h, the store is a memfd (the same shared memory as a file in /dev/shm)
    /// and DIR is not used.
    #[arg(short = 'd', value_name = "DIR")]
    pub(super) directory: Option<PathBuf>,
    /// Back the store with huge pages from the -d mount.
    #[arg(short = 'h', requires = "directory")]
    pub(super) huge_pages: bool,
    /// Plasma's external store for evicted objects: `file://DIR` spills them to DIR
    /// (`skyriver daemon --spill-dir DIR`); other stores are refused.
    #[arg(short = 'e', value_name = "URL")]
    pub(super) external_store: Option<String>,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub(super) help: Option<bool>,
    /// More `skyriver daemon` flags after `--`, e.g. `-- --log debug --no-prefault`.
    #[arg(last = true, value_name = "DAEMON FLAGS")]
    pub(super) daemon_flags: Vec<std::ffi::OsString>,
}

/// `skyriver` started through a link named `plasma_store`.
#[derive(Parser)]
#[command(name = "plasma_store", version)]
pub(super) struct PlasmaStoreCli {
    #[command(flatten)]
    pub(super) args: PlasmaStoreArgs,
}

/// Runs the daemon from plasma_store's flags: they are turned into `skyriver daemon`'s.
pub(super) fn run_plasma_store(args: PlasmaStoreArgs) -> Result<(), CliError> {
    let spill_dir = match &args.external_store {
        Some(url) => match url.strip_prefix("file://") {
            Some(dir) if !dir.is_empty() => Some(dir.to_string()),
            _ => return Err(external_store_refusal(url)),
        },
        None => None,
    };
    let mut argv: Vec<std::ffi::OsString> = vec![
        "skyriver".into(),
        "daemon".into(),
        "--memory".into(),
        args.memory.0.to_string().into(),
        "--socket".into(),
        args.socket.into(),
    ];
    if let (true, Some(dir)) = (args.huge_pages, args.directory) {
        argv.push("--hugepages".into());
        argv.push(dir.into());
    }
    if let Some(dir) = spill_dir {
        argv.push("--spill-dir".into());
        argv.push(dir.into());
    }
    argv.extend(args.daemon_flags);
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Daemon(daemon),
        }) => run_daemon(*daemon),
        Ok(_) => unreachable!("the arguments start with the daemon subcommand"),
        Err(error) => error.exit(),
    }
}

/// Whether this process was started as `plasma_store` (through a link of that name).
pub(super) fn invoked_as_plasma_store(argv0: Option<&std::ffi::OsString>) -> bool {
    argv0
        .map(PathBuf::from)
        .is_some_and(|argv0| argv0.file_name() == Some("plasma_store".as_ref()))
}

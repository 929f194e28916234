//! The command line's typed errors: values clap refuses, and what commands report.

use super::*;
use skyriver_core::auth::ClusterToken;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("skyriver").chain(args.iter().copied()))
}

#[test]
fn the_token_is_parsed_into_a_cluster_token_and_an_empty_one_is_refused_by_clap() {
    let cli = parse(&["daemon", "--token", "s3cret"]).expect("a token parses");
    let Command::Daemon(args) = cli.command else {
        panic!("parsed as another command");
    };
    let token: Option<ClusterToken> = args.token;
    assert_eq!(token, Some(ClusterToken::new("s3cret")));
    assert!(!format!("{token:?}").contains("s3cret"));

    let refused = parse(&["daemon", "--token", ""])
        .err()
        .expect("an empty token is refused");
    assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
    assert!(
        refused.to_string().contains("the cluster token is empty"),
        "{refused}"
    );
}

#[test]
fn flag_values_are_refused_with_a_typed_reason() {
    assert!(matches!(parse_octal("644x"), Err(ValueError::NotOctal(_))));
    assert!(matches!(
        parse_octal("400"),
        Err(ValueError::OwnerLosesAccess(_))
    ));
    assert!(matches!(
        parse_lease_ms("10"),
        Err(ValueError::OutOfRange { .. })
    ));
    assert!(matches!(
        parse_threshold("lots"),
        Err(ValueError::Threshold(_))
    ));
    let refused = parse(&["daemon", "--lease-ms", "10"])
        .err()
        .expect("refused");
    assert!(
        refused
            .to_string()
            .contains("10 is outside 1000 to 3600000"),
        "{refused}"
    );
}

#[test]
fn the_repair_rate_is_a_size_per_second_on_the_head_only() {
    assert_eq!(parse_repair_rate("200MiB/s").unwrap(), 200 << 20);
    assert_eq!(parse_repair_rate("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_repair_rate(" 1000000/s ").unwrap(), 1_000_000);
    assert!(matches!(
        parse_repair_rate("0/s"),
        Err(ValueError::RepairRate(_))
    ));
    assert!(matches!(
        parse_repair_rate("100MB/s"),
        Err(ValueError::RepairRate(_))
    ));
    let cli = parse(&["daemon", "--head", "--repair-rate", "64MiB/s"]).expect("parses");
    let Command::Daemon(args) = cli.command else {
        panic!("parsed as another command");
    };
    assert_eq!(args.repair_rate, Some(64 << 20));
    let cli = parse(&["daemon", "--head"]).expect("parses");
    let Command::Daemon(args) = cli.command else {
        panic!("parsed as another command");
    };
    assert_eq!(args.repair_rate, None, "the registry's default");
    let refused = parse(&["daemon", "--repair-rate", "64MiB/s"])
        .err()
        .expect("only the head repairs");
    assert_eq!(
        refused.kind(),
        clap::error::ErrorKind::MissingRequiredArgument
    );
    // With --join, clap waives the requirement (--head conflicts with it): refused when the
    // daemon's configuration is built.
    let cli = parse(&[
        "daemon",
        "--join",
        "h:7390",
        "--node-id",
        "1",
        "--repair-rate",
        "1MiB",
    ])
    .expect("parses");
    let Command::Daemon(args) = cli.command else {
        panic!("parsed as another command");
    };
    assert!(matches!(
        check_head_only_flags(&args),
        Err(CliError::RepairRateWithoutHead)
    ));
}

#[test]
fn an_input_that_changes_size_while_read_is_a_typed_error() {
    let path = Path::new("input");
    let mut short = std::io::Cursor::new(vec![1u8; 3]);
    let mut data = vec![0u8; 5];
    assert!(matches!(
        read_input_into(&mut short, &mut data, path),
        Err(CliError::InputShrank {
            filled: 3,
            size: 5,
            ..
        })
    ));
    let mut long = std::io::Cursor::new(vec![1u8; 6]);
    assert!(matches!(
        read_input_into(&mut long, &mut data, path),
        Err(CliError::InputGrew { size: 5, .. })
    ));
}

#[test]
fn the_slurm_failure_domain_is_the_topology_address_without_the_node() {
    assert_eq!(
        daemon::slurm_failure_domain("s0.s1.node7"),
        Some("s0.s1".to_string())
    );
    assert_eq!(
        daemon::slurm_failure_domain(" s0.node7\n"),
        Some("s0".to_string())
    );
    // A node under no switch, or an address that names none, gives no domain.
    assert_eq!(daemon::slurm_failure_domain("node7"), None);
    assert_eq!(daemon::slurm_failure_domain(".node7"), None);
    assert_eq!(daemon::slurm_failure_domain(""), None);
}

#[test]
fn a_replica_count_outside_one_to_sixteen_is_refused() {
    assert!(parse(&["daemon", "--replicas", "16"]).is_ok());
    for count in ["0", "17"] {
        let refused = parse(&["daemon", "--replicas", count])
            .err()
            .unwrap_or_else(|| panic!("--replicas {count} accepted"));
        assert!(refused.to_string().contains("16"), "{refused}");
    }
    assert!(parse(&["put", "-", "--replicas", "17"]).is_err());
}

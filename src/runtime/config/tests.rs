use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::iface::PollFailurePolicy;
use crate::verbs::Gid;
use crate::wire::ipv4::Ipv4Cidr;
use crate::wire::translate::MAX_ADDR6;

fn base() -> ConfigKeys {
    ConfigKeys {
        device: Some("rxe0".into()),
        tap: Some("uip0".into()),
        addr: Some("198.18.1.1/24".into()),
        ..Default::default()
    }
}

#[test]
fn defaults_fill_in() {
    let c = Config::from_keys(base()).unwrap();
    assert_eq!(c.port, 1);
    assert_eq!(c.budget, DEFAULT_BUDGET);
    assert_eq!(c.control, PathBuf::from("/run/uipoib/uip0.sock"));
    assert_eq!(c.group, Gid::from_ipv4(DEFAULT_GROUP));
    assert_eq!(c.addr.addr, Ipv4Addr::new(198, 18, 1, 1));
    assert_eq!(c.addr.prefix, 24);
}

#[test]
fn each_bad_value_names_its_key() {
    let cases: Vec<(ConfigKeys, &str)> = vec![
        (
            ConfigKeys {
                addr: Some("198.18.1.1".into()),
                ..base()
            },
            "addr",
        ),
        (
            ConfigKeys {
                addr: Some("198.18.1.999/24".into()),
                ..base()
            },
            "addr",
        ),
        (
            ConfigKeys {
                addr: Some("198.18.1.1/33".into()),
                ..base()
            },
            "addr",
        ),
        (
            ConfigKeys {
                addr: Some("224.0.0.1/24".into()),
                ..base()
            },
            "addr",
        ),
        (
            ConfigKeys {
                addr: Some("198.18.1.1/31".into()),
                ..base()
            },
            "addr",
        ),
        (
            ConfigKeys {
                mtu: Some(9000),
                ..base()
            },
            "mtu",
        ),
        (
            ConfigKeys {
                mtu: Some(10),
                ..base()
            },
            "mtu",
        ),
        (
            ConfigKeys {
                budget: Some(0),
                ..base()
            },
            "budget",
        ),
        (
            ConfigKeys {
                budget: Some(100_000),
                ..base()
            },
            "budget",
        ),
        (
            ConfigKeys {
                recv_ring: Some(300),
                ..base()
            },
            "recv-ring",
        ),
        (
            ConfigKeys {
                send_ring: Some(1),
                ..base()
            },
            "send-ring",
        ),
        (
            ConfigKeys {
                port: Some(0),
                ..base()
            },
            "port",
        ),
        (
            ConfigKeys {
                qkey: Some(0x8000_0001),
                ..base()
            },
            "qkey",
        ),
        (
            ConfigKeys {
                group: Some("198.18.0.1".into()),
                ..base()
            },
            "group",
        ),
        (
            ConfigKeys {
                group: Some("nonsense".into()),
                ..base()
            },
            "group",
        ),
        (
            ConfigKeys {
                tap: Some("a/b".into()),
                ..base()
            },
            "tap",
        ),
        (
            ConfigKeys {
                tap: Some("waytoolonginterfacename".into()),
                ..base()
            },
            "tap",
        ),
        (
            ConfigKeys {
                tap: None,
                ..base()
            },
            "tap",
        ),
        (
            ConfigKeys {
                device: None,
                ..base()
            },
            "device",
        ),
        (
            ConfigKeys {
                neigh_max_age_secs: Some(0),
                ..base()
            },
            "neigh-max-age-secs",
        ),
        (
            ConfigKeys {
                tx_timeout_ms: Some(5),
                ..base()
            },
            "tx-timeout-ms",
        ),
        (
            ConfigKeys {
                restart_max: Some(0),
                ..base()
            },
            "restart-max",
        ),
        (
            ConfigKeys {
                restart_window_secs: Some(0),
                ..base()
            },
            "restart-window-secs",
        ),
        (
            ConfigKeys {
                backoff_initial_ms: Some(500),
                backoff_max_ms: Some(100),
                ..base()
            },
            "backoff-max-ms",
        ),
        (
            ConfigKeys {
                metrics_listen: Some("localhost:9464".into()),
                ..base()
            },
            "metrics-listen",
        ),
        (
            ConfigKeys {
                metrics_listen: Some("127.0.0.1".into()),
                ..base()
            },
            "metrics-listen",
        ),
        (
            ConfigKeys {
                busy_poll_us: Some(100_001),
                ..base()
            },
            "busy-poll-us",
        ),
        (
            ConfigKeys {
                rx_aqm_ms: Some(10_001),
                ..base()
            },
            "rx-aqm-ms",
        ),
        (
            ConfigKeys {
                restart_nice: Some(-21),
                ..base()
            },
            "restart-nice",
        ),
        (
            ConfigKeys {
                restart_nice: Some(20),
                ..base()
            },
            "restart-nice",
        ),
        (
            ConfigKeys {
                rx_boost_nice: Some(-21),
                ..base()
            },
            "rx-boost-nice",
        ),
    ];
    for (cfg, key) in cases {
        match Config::from_keys(cfg.clone()) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{cfg:?}"),
            other => panic!("{cfg:?}: expected an error for {key}, got {other:?}"),
        }
    }
}

#[test]
fn file_keys_and_errors_with_location() {
    let f = ConfigKeys::parse(
        "[interface]\ndevice = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nbudget = 32\nrecv-ring = 1024\n",
    )
    .unwrap();
    let c = Config::from_keys(f).unwrap();
    assert_eq!(c.budget, 32);
    assert_eq!(c.recv_ring, 1024);

    let err = ConfigKeys::parse("device = \"rxe0\"\nbudgte = 3\n").unwrap_err();
    assert!(err.contains("budgte"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let err = ConfigKeys::parse("budget = \"many\"\n").unwrap_err();
    assert!(err.contains("budget"), "{err}");
}

#[test]
fn flags_win_over_file() {
    let flags = ConfigKeys {
        budget: Some(8),
        ..Default::default()
    };
    let file = ConfigKeys {
        budget: Some(32),
        qkey: Some(7),
        ..base()
    };
    let c = Config::from_keys(flags.or(file)).unwrap();
    assert_eq!(c.budget, 8);
    assert_eq!(c.qkey, 7);
}

#[test]
fn shipped_example_config_is_valid() {
    let text = include_str!("../../../config/uipoib.toml");
    let c = Config::from_keys(ConfigKeys::parse(text).unwrap()).unwrap();
    assert_eq!(c.device, "rxe0");
    assert_eq!(c.qkey, DEFAULT_QKEY);
    assert_eq!(c.group, Gid::from_ipv4(DEFAULT_GROUP));
    assert_eq!(c.restart_nice, DEFAULT_RESTART_NICE);
    assert_eq!(c.rx_boost_nice, DEFAULT_RX_BOOST_NICE);
    assert_eq!(c.poller_batch, DEFAULT_POLLER_BATCH);
}

#[test]
fn restart_nice_is_a_nice_level_or_a_named_error() {
    let text = "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\n";
    let c = |extra: &str| ConfigKeys::parse(&format!("{text}{extra}")).map(Config::from_keys);
    assert_eq!(c("").unwrap().unwrap().restart_nice, Some(-10));
    assert_eq!(
        c("restart-nice = 5\n").unwrap().unwrap().restart_nice,
        Some(5)
    );
    match c("restart-nice = -40\n").unwrap() {
        Err(ConfigError::Invalid { key, why }) => {
            assert_eq!(key, "restart-nice");
            assert!(why.contains("-40 is outside -20..=19"), "{why}");
        }
        other => panic!("expected an error for restart-nice, got {other:?}"),
    }
    let err = c("restart-nice = \"high\"\n").unwrap_err();
    assert!(err.contains("restart-nice"), "{err}");
}

#[test]
fn rx_boost_nice_reaches_the_interface_or_is_a_named_error() {
    let text = "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\n";
    let c = |extra: &str| ConfigKeys::parse(&format!("{text}{extra}")).map(Config::from_keys);
    let default = c("").unwrap().unwrap();
    assert_eq!(default.rx_boost_nice, DEFAULT_RX_BOOST_NICE);
    assert_eq!(default.poller_batch, DEFAULT_POLLER_BATCH);
    let set = c("rx-boost-nice = -7\npoller-batch = true\n")
        .unwrap()
        .unwrap();
    assert_eq!(set.iface_config().rx_boost_nice, Some(-7));
    assert!(set.iface_config().poller_batch);
    assert!(set.plan().contains("policy: SCHED_BATCH"), "{}", set.plan());
    assert!(set.plan().contains("queue up: -7"), "{}", set.plan());
    match c("rx-boost-nice = 20\n").unwrap() {
        Err(ConfigError::Invalid { key, why }) => {
            assert_eq!(key, "rx-boost-nice");
            assert!(why.contains("20 is outside -20..=19"), "{why}");
        }
        other => panic!("expected an error for rx-boost-nice, got {other:?}"),
    }
}

#[test]
fn allow_faults_is_an_opt_in_bool() {
    assert!(!Config::from_keys(base()).unwrap().allow_faults);
    let text = "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\n";
    let on = ConfigKeys::parse(&format!("{text}allow-faults = true\n")).unwrap();
    assert!(Config::from_keys(on).unwrap().allow_faults);
    let off = ConfigKeys::parse(&format!("{text}allow-faults = false\n")).unwrap();
    assert!(!Config::from_keys(off).unwrap().allow_faults);
    for bad in ["allow-faults = \"yes\"", "allow-faults = 1"] {
        let err = ConfigKeys::parse(&format!("{text}{bad}\n")).unwrap_err();
        assert!(err.contains("allow-faults"), "{bad}: {err}");
        assert!(err.contains("bool"), "{bad}: {err}");
    }
    let err = ConfigKeys::parse(&format!("{text}allow_faults = true\n")).unwrap_err();
    assert!(err.contains("allow_faults"), "{err}");
    // The flag (true) wins over a file's false.
    let flags = ConfigKeys {
        allow_faults: Some(true),
        ..Default::default()
    };
    let file = ConfigKeys {
        allow_faults: Some(false),
        ..base()
    };
    assert!(Config::from_keys(flags.or(file)).unwrap().allow_faults);
}

#[test]
fn the_alternative_poll_failure_policies_need_allow_faults() {
    assert_eq!(
        Config::from_keys(base()).unwrap().poll_failure,
        PollFailurePolicy::Restart
    );
    for name in ["skip", "retry", "recreate-cq"] {
        let keys = ConfigKeys {
            poll_failure_policy: Some(name.into()),
            ..base()
        };
        let err = Config::from_keys(keys.clone()).unwrap_err().to_string();
        assert!(err.contains("poll-failure-policy"), "{err}");
        assert!(err.contains("allow-faults"), "{err}");
        assert!(err.contains(name), "{err}");
        let c = Config::from_keys(ConfigKeys {
            allow_faults: Some(true),
            ..keys
        })
        .unwrap();
        assert_eq!(c.poll_failure.name(), name);
        assert_eq!(c.iface_config().poll_failure.name(), name);
    }
    // restart needs nothing; an unknown name lists the known ones.
    let keys = ConfigKeys {
        poll_failure_policy: Some("restart".into()),
        ..base()
    };
    assert_eq!(
        Config::from_keys(keys).unwrap().poll_failure,
        PollFailurePolicy::Restart
    );
    let err = Config::from_keys(ConfigKeys {
        poll_failure_policy: Some("ignore".into()),
        allow_faults: Some(true),
        ..base()
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("\"ignore\"") && err.contains("recreate-cq"),
        "{err}"
    );
    // From a file, kebab-case.
    let text = "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nallow-faults = true\npoll-failure-policy = \"retry\"\n";
    let c = Config::from_keys(ConfigKeys::parse(text).unwrap()).unwrap();
    assert_eq!(c.poll_failure, PollFailurePolicy::Retry);
}

#[test]
fn cidr_contains() {
    let c: Ipv4Cidr = "198.18.1.1/24".parse().unwrap();
    assert!(c.contains(Ipv4Addr::new(198, 18, 1, 200)));
    assert!(!c.contains(Ipv4Addr::new(198, 18, 2, 1)));
}

fn with_addrs(list: &[&str]) -> ConfigKeys {
    ConfigKeys {
        addr: Some(AddrList(list.iter().map(|s| s.to_string()).collect())),
        ..base()
    }
}

/// The `why` of an `addr` refusal (the test fails on any other outcome).
fn addr_refusal(list: &[&str]) -> String {
    match Config::from_keys(with_addrs(list)) {
        Err(ConfigError::Invalid { key: "addr", why }) => why,
        other => panic!("{list:?}: expected an addr error, got {other:?}"),
    }
}

#[test]
fn addr_takes_one_ipv4_and_ipv6_addresses() {
    let c = Config::from_keys(with_addrs(&[
        "2001:2:0:1::1/64",
        "198.18.1.1/24",
        "2001:2:0:2::1/127",
    ]))
    .unwrap();
    assert_eq!(c.addr, "198.18.1.1/24".parse().unwrap());
    let six: Vec<String> = c.addr6.iter().map(|a| a.to_string()).collect();
    assert_eq!(six, ["2001:2:0:1::1/64", "2001:2:0:2::1/127"]);
    assert_eq!(c.iface_config().addr6, c.addr6);
    // IPv4 alone: no IPv6 addresses.
    assert!(Config::from_keys(base()).unwrap().addr6.is_empty());
    // As many IPv6 addresses as the datapath carries.
    let many: Vec<String> = (1..=MAX_ADDR6)
        .map(|i| format!("2001:2:0:{i}::1/64"))
        .collect();
    let mut list: Vec<&str> = many.iter().map(String::as_str).collect();
    list.push("198.18.1.1/24");
    assert_eq!(
        Config::from_keys(with_addrs(&list)).unwrap().addr6.len(),
        MAX_ADDR6
    );
}

#[test]
fn each_bad_addr_is_refused_naming_the_value() {
    // No IPv4 address, or an empty list.
    let why = addr_refusal(&["2001:2:0:1::1/64"]);
    assert!(why.contains("an IPv4 address is required"), "{why}");
    assert!(why.contains("ARP"), "{why}");
    assert!(why.contains("2001:2:0:1::1/64"), "{why}");
    let why = addr_refusal(&[]);
    assert!(why.contains("an IPv4 address is required"), "{why}");
    // Two IPv4 addresses.
    let why = addr_refusal(&["198.18.1.1/24", "198.18.2.1/24"]);
    assert!(why.contains("198.18.2.1/24"), "{why}");
    assert!(why.contains("only one IPv4 address"), "{why}");
    // The IPv4 prefix rule, for the list form too.
    let why = addr_refusal(&["2001:2:0:1::1/64", "198.18.1.1/31"]);
    assert!(
        why.contains("198.18.1.1/31") && why.contains("/31"),
        "{why}"
    );
    // A /128 leaves no on-link peer.
    let why = addr_refusal(&["198.18.1.1/24", "2001:2:0:1::1/128"]);
    assert!(why.contains("2001:2:0:1::1/128"), "{why}");
    assert!(why.contains("/128") && why.contains("/127"), "{why}");
    // Duplicates, also with another prefix.
    for list in [
        ["198.18.1.1/24", "2001:2:0:1::1/64", "2001:2:0:1::1/64"],
        ["198.18.1.1/24", "2001:2:0:1::1/64", "2001:2:0:1:0::1/80"],
    ] {
        let why = addr_refusal(&list);
        assert!(why.contains("2001:2:0:1::1 is given twice"), "{why}");
        assert!(why.contains(list[2]), "{why}");
    }
    let why = addr_refusal(&["198.18.1.1/24", "198.18.1.1/24"]);
    assert!(why.contains("198.18.1.1 is given twice"), "{why}");
    // Link-local: the kernel makes it from the MAC.
    for ll in ["fe80::1/64", "febf::1/64"] {
        let why = addr_refusal(&["198.18.1.1/24", ll]);
        assert!(why.contains(ll), "{why}");
        assert!(why.contains("link-local") && why.contains("MAC"), "{why}");
    }
    assert!(
        Config::from_keys(with_addrs(&["198.18.1.1/24", "fec0::1/64"])).is_ok(),
        "fec0::/10 is outside fe80::/10"
    );
    // One too many IPv6 addresses.
    let many: Vec<String> = (0..=MAX_ADDR6)
        .map(|i| format!("2001:2:0:{i}::1/64"))
        .collect();
    let mut list = vec!["198.18.1.1/24"];
    list.extend(many.iter().map(String::as_str));
    let why = addr_refusal(&list);
    assert!(why.contains(&format!("at most {MAX_ADDR6} IPv6")), "{why}");
    assert!(why.contains(&many[MAX_ADDR6]), "{why}");
    // Values that are no address of either kind, or not an interface address.
    for (bad, says) in [
        ("2001:2:0:1::1", "ADDRESS/PREFIX"),
        ("2001:2:0:1::1/129", "prefix"),
        ("2001:2:0:1::1/x", "prefix"),
        ("ff02::1/64", "cannot be an interface address"),
        ("::1/64", "cannot be an interface address"),
        ("::ffff:198.18.1.1/120", "IPv4-mapped"),
        ("198.18.1/24", "neither an IPv4 nor an IPv6 address"),
        ("uip0/24", "neither an IPv4 nor an IPv6 address"),
    ] {
        let why = addr_refusal(&["198.18.1.1/24", bad]);
        assert!(why.contains(bad), "{bad}: {why}");
        assert!(why.contains(says), "{bad}: {why}");
    }
    // IPv6 needs an MTU of 1280 or more; IPv4 alone does not.
    let small = ConfigKeys {
        mtu: Some(1020),
        ..with_addrs(&["198.18.1.1/24", "2001:2:0:1::1/64"])
    };
    match Config::from_keys(small) {
        Err(ConfigError::Invalid { key: "mtu", why }) => assert!(why.contains("1280"), "{why}"),
        other => panic!("expected an mtu error, got {other:?}"),
    }
    let small = ConfigKeys {
        mtu: Some(1020),
        ..base()
    };
    assert_eq!(Config::from_keys(small).unwrap().mtu, Some(1020));
}

#[test]
fn file_addr_is_a_string_or_a_list() {
    let head = "device = \"rxe0\"\ntap = \"uip0\"\n";
    let one = ConfigKeys::parse(&format!("{head}addr = \"198.18.1.1/24\"\n")).unwrap();
    assert_eq!(one.addr, Some(AddrList(vec!["198.18.1.1/24".into()])));
    let c = Config::from_keys(one).unwrap();
    assert!(c.addr6.is_empty());
    let list = ConfigKeys::parse(&format!(
        "[interface]\n{head}addr = [\"198.18.1.1/24\", \"2001:2:0:1::1/64\"]\n"
    ))
    .unwrap();
    let c = Config::from_keys(list).unwrap();
    assert_eq!(c.addr, "198.18.1.1/24".parse().unwrap());
    assert_eq!(c.addr6, vec!["2001:2:0:1::1/64".parse().unwrap()]);
    // A list of one works as the string does.
    let c = Config::from_keys(
        ConfigKeys::parse(&format!("{head}addr = [\"198.18.1.1/24\"]\n")).unwrap(),
    )
    .unwrap();
    assert_eq!(c.addr, "198.18.1.1/24".parse().unwrap());
    // Wrong types name the key and the line, in either form.
    for bad in [
        "addr = 5",
        "addr = [\"198.18.1.1/24\", 5]",
        "addr = { v4 = \"198.18.1.1/24\" }",
        "addr = [[\"198.18.1.1/24\"]]",
    ] {
        let err = ConfigKeys::parse(&format!("{head}{bad}\n")).unwrap_err();
        assert!(err.contains("addr"), "{bad}: {err}");
        assert!(err.contains("line 3"), "{bad}: {err}");
    }
    let err = ConfigKeys::parse(&format!("{head}addr = 5\n")).unwrap_err();
    assert!(
        err.contains("an address/prefix string or a list of them"),
        "{err}"
    );
}

#[test]
fn command_line_addrs_replace_the_files_list() {
    let file = ConfigKeys::parse(
        "device = \"rxe0\"\ntap = \"uip0\"\naddr = [\"198.18.1.1/24\", \"2001:2:0:1::1/64\"]\n",
    )
    .unwrap();
    // Only an IPv4 address on the command line: the file's IPv6 one is gone too.
    let flags = ConfigKeys {
        addr: Some("198.18.9.1/24".into()),
        ..Default::default()
    };
    let c = Config::from_keys(flags.or(file.clone())).unwrap();
    assert_eq!(c.addr, "198.18.9.1/24".parse().unwrap());
    assert!(c.addr6.is_empty(), "{:?}", c.addr6);
    // Only IPv6 on the command line: the file's IPv4 address is not kept either.
    let flags = ConfigKeys {
        addr: Some("2001:2:0:9::1/64".into()),
        ..Default::default()
    };
    match Config::from_keys(flags.or(file.clone())) {
        Err(ConfigError::Invalid { key: "addr", why }) => {
            assert!(why.contains("an IPv4 address is required"), "{why}")
        }
        other => panic!("expected an addr error, got {other:?}"),
    }
    // No addresses on the command line: the file's list as it is.
    let c = Config::from_keys(ConfigKeys::default().or(file)).unwrap();
    assert_eq!(c.addr6.len(), 1);
}

#[test]
fn a_range_error_from_a_file_names_the_file_line_and_key() {
    let text = "[interface]\ndevice = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\n\n  recv-ring = 3\n";
    let keys = ConfigKeys::parse(text).unwrap();
    let err = Config::from_keys(keys)
        .unwrap_err()
        .in_file(std::path::Path::new("/etc/uipoib/uip0.toml"), text);
    let msg = err.to_string();
    assert!(
        msg.starts_with("config file /etc/uipoib/uip0.toml:6: recv-ring: "),
        "{msg}"
    );
    // A key the file does not hold stays as it was; other errors pass through.
    let e = ConfigError::Invalid {
        key: "mtu",
        why: "x".into(),
    }
    .in_file(std::path::Path::new("f.toml"), text);
    assert_eq!(e.to_string(), "invalid mtu: x");
    // A key that only starts like another is not taken for it.
    let e = ConfigError::Invalid {
        key: "tap",
        why: "x".into(),
    }
    .in_file(
        std::path::Path::new("f.toml"),
        "tap-offload = true\ntap = \"u\"\n",
    );
    assert_eq!(e.to_string(), "config file f.toml:2: tap: x");
}

#[test]
fn metrics_listen_is_optional_and_parsed() {
    assert_eq!(Config::from_keys(base()).unwrap().metrics_listen, None);
    let f = ConfigKeys::parse(
        "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nmetrics-listen = \"127.0.0.1:9464\"\n",
    )
    .unwrap();
    let c = Config::from_keys(f).unwrap();
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    let c = Config::from_keys(ConfigKeys {
        metrics_listen: Some("[::1]:0".into()),
        ..base()
    })
    .unwrap();
    assert_eq!(c.metrics_listen, Some("[::1]:0".parse().unwrap()));
    let err = Config::from_keys(ConfigKeys {
        metrics_listen: Some("nowhere".into()),
        ..base()
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("metrics-listen") && err.contains("nowhere"),
        "{err}"
    );
}

#[test]
fn rx_aqm_is_off_unless_asked_for_and_reaches_the_interface() {
    let c = Config::from_keys(base()).unwrap();
    assert!(c.rx_aqm.is_zero());
    assert!(c.plan().contains("receive-queue AQM off"), "{}", c.plan());
    let c = Config::from_keys(ConfigKeys {
        rx_aqm_ms: Some(100),
        ..base()
    })
    .unwrap();
    assert_eq!(c.iface_config().rx_aqm, Duration::from_millis(100));
    assert!(
        c.plan().contains("receive-queue AQM 100 ms"),
        "{}",
        c.plan()
    );
}

#[test]
fn busy_poll_is_off_unless_asked_for_and_reaches_the_interface() {
    let c = Config::from_keys(base()).unwrap();
    assert!(c.busy_poll.is_zero());
    assert!(c.plan().contains("busy poll off"), "{}", c.plan());
    let c = Config::from_keys(ConfigKeys {
        busy_poll_us: Some(250),
        ..base()
    })
    .unwrap();
    assert_eq!(c.iface_config().busy_poll, Duration::from_micros(250));
    assert!(c.plan().contains("busy poll 250 us"), "{}", c.plan());
}

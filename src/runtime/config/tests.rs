use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::*;
use crate::verbs::Gid;
use crate::wire::ipv4::Ipv4Cidr;

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
fn cidr_contains() {
    let c: Ipv4Cidr = "198.18.1.1/24".parse().unwrap();
    assert!(c.contains(Ipv4Addr::new(198, 18, 1, 200)));
    assert!(!c.contains(Ipv4Addr::new(198, 18, 2, 1)));
}

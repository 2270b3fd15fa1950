use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::*;
use crate::verbs::Gid;
use crate::wire::ipv4::Ipv4Cidr;

fn base() -> FileConfig {
    FileConfig {
        device: Some("rxe0".into()),
        tap: Some("uip0".into()),
        addr: Some("198.18.1.1/24".into()),
        ..Default::default()
    }
}

#[test]
fn defaults_fill_in() {
    let c = Config::from_file_config(base()).unwrap();
    assert_eq!(c.port, 1);
    assert_eq!(c.budget, DEFAULT_BUDGET);
    assert_eq!(c.control, PathBuf::from("/run/uipoib/uip0.sock"));
    assert_eq!(c.group, Gid::from_ipv4(DEFAULT_GROUP));
    assert_eq!(c.addr.addr, Ipv4Addr::new(198, 18, 1, 1));
    assert_eq!(c.addr.prefix, 24);
}

#[test]
fn each_bad_value_names_its_key() {
    let cases: Vec<(FileConfig, &str)> = vec![
        (
            FileConfig {
                addr: Some("198.18.1.1".into()),
                ..base()
            },
            "addr",
        ),
        (
            FileConfig {
                addr: Some("198.18.1.999/24".into()),
                ..base()
            },
            "addr",
        ),
        (
            FileConfig {
                addr: Some("198.18.1.1/33".into()),
                ..base()
            },
            "addr",
        ),
        (
            FileConfig {
                addr: Some("224.0.0.1/24".into()),
                ..base()
            },
            "addr",
        ),
        (
            FileConfig {
                addr: Some("198.18.1.1/31".into()),
                ..base()
            },
            "addr",
        ),
        (
            FileConfig {
                mtu: Some(9000),
                ..base()
            },
            "mtu",
        ),
        (
            FileConfig {
                mtu: Some(10),
                ..base()
            },
            "mtu",
        ),
        (
            FileConfig {
                budget: Some(0),
                ..base()
            },
            "budget",
        ),
        (
            FileConfig {
                budget: Some(100_000),
                ..base()
            },
            "budget",
        ),
        (
            FileConfig {
                recv_ring: Some(300),
                ..base()
            },
            "recv-ring",
        ),
        (
            FileConfig {
                send_ring: Some(1),
                ..base()
            },
            "send-ring",
        ),
        (
            FileConfig {
                port: Some(0),
                ..base()
            },
            "port",
        ),
        (
            FileConfig {
                qkey: Some(0x8000_0001),
                ..base()
            },
            "qkey",
        ),
        (
            FileConfig {
                group: Some("198.18.0.1".into()),
                ..base()
            },
            "group",
        ),
        (
            FileConfig {
                group: Some("nonsense".into()),
                ..base()
            },
            "group",
        ),
        (
            FileConfig {
                tap: Some("a/b".into()),
                ..base()
            },
            "tap",
        ),
        (
            FileConfig {
                tap: Some("waytoolonginterfacename".into()),
                ..base()
            },
            "tap",
        ),
        (
            FileConfig {
                tap: None,
                ..base()
            },
            "tap",
        ),
        (
            FileConfig {
                device: None,
                ..base()
            },
            "device",
        ),
        (
            FileConfig {
                neigh_max_age_secs: Some(0),
                ..base()
            },
            "neigh-max-age-secs",
        ),
        (
            FileConfig {
                tx_timeout_ms: Some(5),
                ..base()
            },
            "tx-timeout-ms",
        ),
        (
            FileConfig {
                restart_max: Some(0),
                ..base()
            },
            "restart-max",
        ),
        (
            FileConfig {
                restart_window_secs: Some(0),
                ..base()
            },
            "restart-window-secs",
        ),
        (
            FileConfig {
                backoff_initial_ms: Some(500),
                backoff_max_ms: Some(100),
                ..base()
            },
            "backoff-max-ms",
        ),
    ];
    for (cfg, key) in cases {
        match Config::from_file_config(cfg.clone()) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{cfg:?}"),
            other => panic!("{cfg:?}: expected an error for {key}, got {other:?}"),
        }
    }
}

#[test]
fn file_keys_and_errors_with_location() {
    let f = FileConfig::parse(
        "[interface]\ndevice = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nbudget = 32\nrecv-ring = 1024\n",
    )
    .unwrap();
    let c = Config::from_file_config(f).unwrap();
    assert_eq!(c.budget, 32);
    assert_eq!(c.recv_ring, 1024);

    let err = FileConfig::parse("device = \"rxe0\"\nbudgte = 3\n").unwrap_err();
    assert!(err.contains("budgte"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let err = FileConfig::parse("budget = \"many\"\n").unwrap_err();
    assert!(err.contains("budget"), "{err}");
}

#[test]
fn flags_win_over_file() {
    let flags = FileConfig {
        budget: Some(8),
        ..Default::default()
    };
    let file = FileConfig {
        budget: Some(32),
        qkey: Some(7),
        ..base()
    };
    let c = Config::from_file_config(flags.or(file)).unwrap();
    assert_eq!(c.budget, 8);
    assert_eq!(c.qkey, 7);
}

#[test]
fn shipped_example_config_is_valid() {
    let text = include_str!("../../../config/uipoib.toml");
    let c = Config::from_file_config(FileConfig::parse(text).unwrap()).unwrap();
    assert_eq!(c.device, "rxe0");
    assert_eq!(c.qkey, DEFAULT_QKEY);
    assert_eq!(c.group, Gid::from_ipv4(DEFAULT_GROUP));
}

#[test]
fn allow_faults_is_an_opt_in_bool() {
    assert!(!Config::from_file_config(base()).unwrap().allow_faults);
    let text = "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\n";
    let on = FileConfig::parse(&format!("{text}allow-faults = true\n")).unwrap();
    assert!(Config::from_file_config(on).unwrap().allow_faults);
    let off = FileConfig::parse(&format!("{text}allow-faults = false\n")).unwrap();
    assert!(!Config::from_file_config(off).unwrap().allow_faults);
    for bad in ["allow-faults = \"yes\"", "allow-faults = 1"] {
        let err = FileConfig::parse(&format!("{text}{bad}\n")).unwrap_err();
        assert!(err.contains("allow-faults"), "{bad}: {err}");
        assert!(err.contains("bool"), "{bad}: {err}");
    }
    let err = FileConfig::parse(&format!("{text}allow_faults = true\n")).unwrap_err();
    assert!(err.contains("allow_faults"), "{err}");
    // The flag (true) wins over a file's false.
    let flags = FileConfig {
        allow_faults: Some(true),
        ..Default::default()
    };
    let file = FileConfig {
        allow_faults: Some(false),
        ..base()
    };
    assert!(
        Config::from_file_config(flags.or(file))
            .unwrap()
            .allow_faults
    );
}

#[test]
fn cidr_contains() {
    let c: Ipv4Cidr = "198.18.1.1/24".parse().unwrap();
    assert!(c.contains(Ipv4Addr::new(198, 18, 1, 200)));
    assert!(!c.contains(Ipv4Addr::new(198, 18, 2, 1)));
}

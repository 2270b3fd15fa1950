//! The config file parser and validation: `ConfigKeys::parse`, then
//! `Config::from_keys` on the keys alone and filled in with the required ones.
//! Never a panic; a validated config keeps every documented bound, and the address and
//! group survive printing and parsing again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::runtime::config::{Config, ConfigKeys, MAX_IPOIB_MTU, MIN_IPOIB_MTU, check_ifname};
use uipoib::verbs::Gid;
use uipoib::wire::ipv4::Ipv4Cidr;

fn check(c: &Config) {
    assert!(!c.device.is_empty());
    assert!(check_ifname("tap", &c.tap).is_ok(), "tap {:?}", c.tap);
    assert!(c.addr.prefix <= 30);
    assert_eq!(c.addr.to_string().parse::<Ipv4Cidr>(), Ok(c.addr));
    assert!(c.port >= 1);
    if let Some(m) = c.mtu {
        assert!((MIN_IPOIB_MTU..=MAX_IPOIB_MTU).contains(&m), "mtu {m}");
    }
    for r in [c.recv_ring, c.send_ring] {
        assert!(r.is_power_of_two() && (2..=16384).contains(&r), "ring {r}");
    }
    assert!((1..=c.recv_ring).contains(&c.budget));
    assert!((1..=256).contains(&c.poll_batch));
    assert!((1..=c.send_ring).contains(&c.tx_batch));
    assert_eq!(c.qkey & 0x8000_0000, 0);
    assert!(c.group.is_multicast());
    assert_eq!(c.group.to_string().parse::<Gid>(), Ok(c.group));
    assert!(c.neigh_capacity >= 1);
    assert!(!c.neigh_max_age.is_zero());
    assert!(c.restart.backoff_initial <= c.restart.backoff_max);
    assert!(c.restart.max_restarts >= 1);
    let p = c.iface_config();
    assert_eq!(p.endpoint.recv_slots, c.recv_ring);
    assert_eq!(p.endpoint.max_payload, c.mtu.map(|m| m + 4));
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The small parsers on their own.
    if let Ok(a) = text.parse::<Ipv4Cidr>() {
        assert_eq!(a.to_string().parse::<Ipv4Cidr>(), Ok(a));
    }
    if let Ok(g) = text.parse::<Gid>() {
        assert_eq!(g.to_string().parse::<Gid>(), Ok(g));
    }
    let Ok(f) = ConfigKeys::parse(text) else {
        return;
    };
    if let Ok(c) = Config::from_keys(f.clone()) {
        check(&c);
    }
    let required = ConfigKeys {
        device: Some("rxe0".into()),
        tap: Some("uip0".into()),
        addr: Some("198.18.1.1/24".into()),
        ..ConfigKeys::default()
    };
    if let Ok(c) = Config::from_keys(f.or(required)) {
        check(&c);
    }
});

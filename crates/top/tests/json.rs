//! The JSON form: the field set, units in the names, nulls for what is missing.

mod common;

use quench_top::json::{report, FORMAT};
use quench_top::prom;
use quench_top::server::ServerTracker;
use serde_json::{json, Value};

const GPU_FIELDS: [&str; 27] = [
    "index",
    "name",
    "uuid",
    "pci_bus_id",
    "utilization_gpu_percent",
    "utilization_memory_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "memory_reserved_bytes",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "power_draw_watts",
    "power_limit_watts",
    "temperature_c",
    "fan_speed_percent",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_link_count",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "ecc_corrected_volatile_count",
    "ecc_uncorrected_volatile_count",
    "ecc_corrected_aggregate_count",
    "ecc_uncorrected_aggregate_count",
    "xid_events_count",
    "xid_last_code",
    "processes",
];

/// Fields that are not a measurement and so carry no unit.
const IDENTITY: [&str; 5] = ["index", "name", "uuid", "pci_bus_id", "processes"];
const UNITS: [&str; 8] = [
    "_percent",
    "_bytes",
    "_mhz",
    "_watts",
    "_c",
    "_bytes_per_s",
    "_count",
    "_code",
];

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn field_set_and_units() {
    let mut rng = common::rng("field_set_and_units");
    let g = common::full_gpu(&mut rng, 0);
    let v = report(&common::snapshot(42, vec![g]), None);
    assert_eq!(
        keys(&v),
        [
            "driver_version",
            "format",
            "gpus",
            "nvml_version",
            "server",
            "time_unix_ms"
        ]
    );
    assert_eq!(v["format"], FORMAT);
    let gpu = &v["gpus"][0];
    let mut expected: Vec<String> = GPU_FIELDS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(keys(gpu), expected);
    for k in keys(gpu) {
        if IDENTITY.contains(&k.as_str()) {
            continue;
        }
        assert!(UNITS.iter().any(|u| k.ends_with(u)), "{k} carries no unit");
    }
    assert_eq!(
        keys(&gpu["processes"][0]),
        ["kind", "name", "pid", "used_memory_bytes"]
    );
}

#[test]
fn values_round_trip_exactly() {
    let mut rng = common::rng("values_round_trip_exactly");
    let gpus: Vec<_> = (0..3).map(|i| common::full_gpu(&mut rng, i)).collect();
    let snap = common::snapshot(1_700_000_000_123, gpus.clone());
    let v = report(&snap, None);
    assert_eq!(v["time_unix_ms"], 1_700_000_000_123u64);
    assert_eq!(v["driver_version"], "580.159.03");
    assert_eq!(v["server"], Value::Null);
    for (g, j) in gpus.iter().zip(v["gpus"].as_array().unwrap()) {
        // Every field compared, through the struct's own serialisation.
        assert_eq!(*j, serde_json::to_value(g).unwrap());
        assert_eq!(j["memory_used_bytes"], g.memory_used_bytes.unwrap());
        assert_eq!(j["power_draw_watts"], g.power_draw_watts.unwrap());
        assert_eq!(j["sm_clock_mhz"], g.sm_clock_mhz.unwrap());
        assert_eq!(j["temperature_c"], g.temperature_c.unwrap());
        assert_eq!(j["pcie_tx_bytes_per_s"], g.pcie_tx_bytes_per_s.unwrap());
        for (p, jp) in g
            .processes
            .as_ref()
            .unwrap()
            .iter()
            .zip(j["processes"].as_array().unwrap())
        {
            assert_eq!(jp["pid"], p.pid);
            assert_eq!(jp["used_memory_bytes"], p.used_memory_bytes.unwrap());
            assert_eq!(jp["name"], p.name.clone().unwrap());
        }
    }
}

#[test]
fn missing_readings_are_null_not_zero() {
    let v = report(&common::snapshot(1, vec![common::empty_gpu(3)]), None);
    let gpu = v["gpus"][0].as_object().unwrap();
    for (k, val) in gpu {
        if k == "index" {
            assert_eq!(*val, json!(3));
        } else {
            assert_eq!(*val, Value::Null, "{k} should be null");
        }
    }
    let line = v.to_string();
    assert!(
        !line.contains(":0,") && !line.contains(":0}"),
        "a zero slipped in: {line}"
    );
}

#[test]
fn server_section_carries_rates() {
    let mut tracker = ServerTracker::new();
    let a = prom::parse("quench_completion_tokens_total 10\nquench_queue_depth 2\n").unwrap();
    let b = prom::parse("quench_completion_tokens_total 60\nquench_queue_depth 4\n").unwrap();
    tracker.observe("http://x/metrics", 0, &a);
    let s = tracker.observe("http://x/metrics", 500, &b);
    let v = report(&common::snapshot(1, vec![]), Some(&s));
    assert_eq!(v["server"]["tokens_per_s"], 100.0);
    assert_eq!(v["server"]["queue_depth"], 4.0);
    assert_eq!(v["server"]["prompt_tokens_per_s"], Value::Null);
    assert_eq!(v["server"]["error"], Value::Null);
}

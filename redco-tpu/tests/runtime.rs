//! The PJRT runtime against a real plugin (`REDCO_PJRT_PLUGIN`).

use redco_core::HostData;
use redco_tpu::{Api, Client, CompileOptions, OptionValue};

/// A client with `devices` devices on the CPU plugin (other plugins have what they have).
fn client(devices: i64) -> Client {
    let api = Api::from_env().expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cpu = api.path().to_string_lossy().contains("cpu");
    let opts = if cpu { vec![("cpu_device_count".to_string(), OptionValue::Int(devices))] } else { vec![] };
    Client::new(api, &opts).unwrap()
}

#[test]
fn add_runs_on_every_device() {
    let c = client(2);
    let n = c.devices().len().min(2);
    assert!(c.platform() != "cpu" || n == 2, "{c:?}");
    let text = r#"
func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
  %0 = stablehlo.add %a, %b : tensor<3xf32>
  return %0 : tensor<3xf32>
}"#;
    let exe = c.compile(text.as_bytes(), &CompileOptions::portable(), "add").unwrap();
    for d in 0..n {
        let a = c.upload(d, &HostData::F32(vec![1.0, 2.0, 3.0]), &[3]).unwrap();
        let b = c.upload(d, &HostData::F32(vec![10.0, 20.0, 30.0]), &[3]).unwrap();
        let out = exe.execute(d, &[&a, &b]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].download().unwrap(), HostData::F32(vec![11.0, 22.0, 33.0]));
    }
}

#[test]
fn a_client_with_key_value_callbacks_backed_by_the_bootstrap_store() {
    let api = Api::from_env().expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let store: std::sync::Arc<dyn redco_core::runtime::Store> =
        std::sync::Arc::new(redco_core::runtime::store::MemStore::new());
    let kv = redco_tpu::KvStore::new(store, "pjrt/");
    let c = Client::with_store(api, &Client::default_options(api, 1), Some(kv)).unwrap();
    assert_eq!(c.devices().len(), 1);
    let b = c.upload(0, &HostData::I64(vec![7, 8]), &[2]).unwrap();
    assert_eq!(b.download().unwrap(), HostData::I64(vec![7, 8]));
}

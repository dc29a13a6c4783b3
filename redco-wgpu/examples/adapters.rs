//! Lists the wgpu adapters, one per line, tab-separated: index, name, graphics API, device
//! type, driver, and `used` on the one `Wgpu::new` opens (`REDCO_WGPU_ADAPTER` applies).
//! `cargo xtask gpu-check wgpu` reads this.

use redco_wgpu::Wgpu;

fn main() {
    let used = Wgpu::new().map(|w| w.adapter_info());
    for (i, a) in Wgpu::adapters().iter().enumerate() {
        let mark = match &used {
            Ok(u) if u.name == a.name && u.backend == a.backend && u.device_type == a.device_type => "used",
            _ => "",
        };
        let driver = format!("{} {}", a.driver, a.driver_info);
        println!("{i}\t{}\t{:?}\t{:?}\t{}\t{mark}", a.name, a.backend, a.device_type, driver.trim());
    }
    if let Err(e) = used {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

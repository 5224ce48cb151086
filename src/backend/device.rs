//! Which device computes: a `--device` request (`auto`, `cpu`, `vulkan[:N]`, `cuda[:N]`,
//! `metal`) parsed once, and resolved once against ggml's device registry into a [`Device`].
//! A backend this binary was built without, a device that is absent or an index out of range is
//! a user error naming what was asked for and how to get it.

use crate::bail;
use crate::error::{Error, Result};
use llama_cpp_sys_2 as sys;
use std::fmt;
use std::str::FromStr;

/// A GPU API ggml can be built with (each a cargo feature of the same name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuApi {
    Vulkan,
    Cuda,
    Metal,
}

impl GpuApi {
    pub const ALL: [GpuApi; 3] = [GpuApi::Vulkan, GpuApi::Cuda, GpuApi::Metal];

    /// The name on the command line, and the cargo feature that builds it.
    pub fn name(self) -> &'static str {
        match self {
            GpuApi::Vulkan => "vulkan",
            GpuApi::Cuda => "cuda",
            GpuApi::Metal => "metal",
        }
    }

    /// Whether this binary was built with the API's backend.
    pub fn built(self) -> bool {
        match self {
            GpuApi::Vulkan => cfg!(feature = "vulkan"),
            GpuApi::Cuda => cfg!(feature = "cuda"),
            GpuApi::Metal => cfg!(feature = "metal"),
        }
    }

    /// The backend's name in ggml's registry.
    fn registry_name(self) -> &'static str {
        match self {
            GpuApi::Vulkan => "Vulkan",
            GpuApi::Cuda => "CUDA",
            GpuApi::Metal => "MTL",
        }
    }

    /// What a build with this backend needs (the README says more).
    fn needs(self) -> &'static str {
        match self {
            GpuApi::Vulkan => "the Vulkan headers and loader, glslc and SPIR-V headers",
            GpuApi::Cuda => "the CUDA toolkit (nvcc)",
            GpuApi::Metal => "macOS",
        }
    }
}

/// What `--device` asked for, as given (parsed, not yet checked against the registry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceRequest {
    /// The first GPU in the registry this binary can use, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A GPU backend's device: `index` among that backend's devices (none: its first).
    Gpu {
        api: GpuApi,
        index: Option<usize>,
    },
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => write!(f, "auto"),
            DeviceRequest::Cpu => write!(f, "cpu"),
            DeviceRequest::Gpu { api, index: None } => write!(f, "{}", api.name()),
            DeviceRequest::Gpu {
                api,
                index: Some(i),
            } => write!(f, "{}:{i}", api.name()),
        }
    }
}

const DEVICE_FORMS: &str = "auto, cpu, vulkan[:N], cuda[:N] or metal";

impl FromStr for DeviceRequest {
    type Err = Error;

    fn from_str(s: &str) -> Result<DeviceRequest> {
        let given = s;
        let s = s.trim().to_ascii_lowercase();
        let (name, index) = match s.split_once(':') {
            Some((name, n)) => {
                let Ok(i) = n.parse::<usize>() else {
                    bail!(
                        Options,
                        "--device {given:?}: the device index {n:?} is not a number (one of {DEVICE_FORMS})"
                    );
                };
                (name, Some(i))
            }
            None => (s.as_str(), None),
        };
        let request = match name {
            "auto" | "cpu" if index.is_some() => bail!(
                Options,
                "--device {given:?}: {name} takes no index (one of {DEVICE_FORMS})"
            ),
            "auto" => DeviceRequest::Auto,
            "cpu" => DeviceRequest::Cpu,
            _ => match GpuApi::ALL.into_iter().find(|a| a.name() == name) {
                Some(api) => DeviceRequest::Gpu { api, index },
                None => bail!(
                    Options,
                    "--device {given:?} is not a device (one of {DEVICE_FORMS})"
                ),
            },
        };
        Ok(request)
    }
}

/// A device of ggml's registry, resolved from a [`DeviceRequest`]. The handle is ggml's and
/// lives as long as the process.
#[derive(Clone, Copy)]
pub struct Device {
    dev: sys::ggml_backend_dev_t,
}

// A registry device is a static, thread-safe description owned by ggml.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.dev == other.dev
    }
}

impl Eq for Device {}

impl Device {
    /// ggml's CPU device.
    pub fn cpu() -> Result<Device> {
        // SAFETY: a registry lookup; null is checked.
        let dev = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        if dev.is_null() {
            bail!(Internal, "ggml: no CPU device in the backend registry");
        }
        Ok(Device { dev })
    }

    pub(super) fn raw(self) -> sys::ggml_backend_dev_t {
        self.dev
    }

    pub fn is_cpu(self) -> bool {
        // SAFETY: a static registry device.
        unsafe { sys::ggml_backend_dev_type(self.dev) == sys::GGML_BACKEND_DEVICE_TYPE_CPU }
    }

    /// ggml's name for it (`CPU`, `Vulkan0`, `CUDA0`, `MTL0`).
    pub fn name(self) -> String {
        // SAFETY: a static string owned by ggml.
        unsafe { super::cstr(sys::ggml_backend_dev_name(self.dev)) }
    }

    /// Its description (the GPU's or CPU's model name).
    pub fn description(self) -> String {
        // SAFETY: a static string owned by ggml.
        unsafe { super::cstr(sys::ggml_backend_dev_description(self.dev)) }
    }

    /// `(free, total)` bytes of its memory, as its backend reports them.
    pub fn memory(self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a static registry device; two out-pointers to locals.
        unsafe { sys::ggml_backend_dev_memory(self.dev, &mut free, &mut total) };
        (free, total)
    }

    /// The kind ggml gives it: cpu, gpu, igpu, accel.
    pub fn kind(self) -> &'static str {
        // SAFETY: a static registry device.
        kind_name(unsafe { sys::ggml_backend_dev_type(self.dev) })
    }

    /// Its backend's name in the registry (`CPU`, `Vulkan`, `CUDA`, `MTL`).
    pub fn backend_name(self) -> String {
        // SAFETY: a static registry device and its static registration.
        unsafe {
            super::cstr(sys::ggml_backend_reg_name(
                sys::ggml_backend_dev_backend_reg(self.dev),
            ))
        }
    }

    /// `name (description)`, as `--profile` and `info` show which device ran.
    pub fn describe(self) -> String {
        let d = self.description();
        if d.is_empty() || d == self.name() {
            self.name()
        } else {
            format!("{} ({d})", self.name())
        }
    }
}

fn kind_name(t: sys::ggml_backend_dev_type) -> &'static str {
    match t {
        sys::GGML_BACKEND_DEVICE_TYPE_CPU => "cpu",
        sys::GGML_BACKEND_DEVICE_TYPE_GPU => "gpu",
        sys::GGML_BACKEND_DEVICE_TYPE_IGPU => "igpu",
        sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => "accel",
        _ => "other",
    }
}

/// Every device of the registry, in its order.
pub fn registry() -> Vec<Device> {
    // SAFETY: registry queries; devices are static.
    unsafe {
        (0..sys::ggml_backend_dev_count())
            .map(|i| Device {
                dev: sys::ggml_backend_dev_get(i),
            })
            .filter(|d| !d.dev.is_null())
            .collect()
    }
}

/// The GPU APIs this binary was built with.
pub fn built_apis() -> Vec<GpuApi> {
    GpuApi::ALL.into_iter().filter(|a| a.built()).collect()
}

fn is_gpu(d: Device) -> bool {
    // SAFETY: a static registry device.
    let t = unsafe { sys::ggml_backend_dev_type(d.dev) };
    t == sys::GGML_BACKEND_DEVICE_TYPE_GPU || t == sys::GGML_BACKEND_DEVICE_TYPE_IGPU
}

impl DeviceRequest {
    /// The registry device this request names, or a user error saying why there is none.
    pub fn resolve(self) -> Result<Device> {
        match self {
            DeviceRequest::Cpu => Device::cpu(),
            DeviceRequest::Auto => match registry().into_iter().find(|&d| is_gpu(d)) {
                Some(d) => Ok(d),
                None => Device::cpu(),
            },
            DeviceRequest::Gpu { api, index } => {
                if !api.built() {
                    bail!(
                        Options,
                        "--device {self}: this parakeet was built without the {0} backend; build \
                         it with `cargo build --release --features {0}` (needs {1})",
                        api.name(),
                        api.needs()
                    );
                }
                let devices: Vec<Device> = registry()
                    .into_iter()
                    .filter(|d| d.backend_name().eq_ignore_ascii_case(api.registry_name()))
                    .collect();
                let i = index.unwrap_or(0);
                match devices.get(i) {
                    Some(&d) => Ok(d),
                    None if devices.is_empty() => Err(Error::Options(format!(
                        "--device {self}: no {} device found on this machine (its driver \
                         is missing or sees no device{}); `parakeet info --system` lists the \
                         devices, `--device cpu` runs without one",
                        api.name(),
                        if api == GpuApi::Vulkan {
                            "; a CPU Vulkan driver such as lavapipe is only used when \
                             GGML_VK_VISIBLE_DEVICES names it"
                        } else {
                            ""
                        }
                    ))),
                    None => Err(Error::Options(format!(
                        "--device {self}: device index {i} is out of range; this machine has {} \
                         {} device{} ({}:0 to {}:{})",
                        devices.len(),
                        api.name(),
                        if devices.len() == 1 { "" } else { "s" },
                        api.name(),
                        api.name(),
                        devices.len() - 1
                    ))),
                }
            }
        }
    }
}

/// Mebibytes, for messages.
pub fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_into_one_value() {
        let ok = [
            ("auto", DeviceRequest::Auto),
            ("cpu", DeviceRequest::Cpu),
            ("CPU", DeviceRequest::Cpu),
            (
                "vulkan",
                DeviceRequest::Gpu {
                    api: GpuApi::Vulkan,
                    index: None,
                },
            ),
            (
                "cuda:1",
                DeviceRequest::Gpu {
                    api: GpuApi::Cuda,
                    index: Some(1),
                },
            ),
            (
                "metal",
                DeviceRequest::Gpu {
                    api: GpuApi::Metal,
                    index: None,
                },
            ),
        ];
        for (s, want) in ok {
            assert_eq!(s.parse::<DeviceRequest>().unwrap(), want, "{s}");
        }
        for (s, says) in [
            ("gpu", "is not a device"),
            ("vulkan:x", "is not a number"),
            ("cuda:-1", "is not a number"),
            ("cpu:0", "takes no index"),
            ("", "is not a device"),
        ] {
            let e = s.parse::<DeviceRequest>().unwrap_err();
            assert!(
                matches!(&e, Error::Options(m) if m.contains(says)),
                "{s}: {e}"
            );
        }
    }

    #[test]
    fn the_cpu_resolves_and_auto_finds_a_device() {
        let cpu = DeviceRequest::Cpu.resolve().unwrap();
        assert!(cpu.is_cpu());
        assert_eq!(cpu.kind(), "cpu");
        let auto = DeviceRequest::Auto.resolve().unwrap();
        // Without a GPU in the registry, auto is the CPU.
        if !registry().into_iter().any(is_gpu) {
            assert_eq!(auto, cpu);
        }
    }

    #[test]
    fn a_backend_not_built_in_names_its_feature() {
        for api in GpuApi::ALL.into_iter().filter(|a| !a.built()) {
            let e = DeviceRequest::Gpu { api, index: None }
                .resolve()
                .unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::Options(_)), "{m}");
            assert!(m.contains(&format!("--features {}", api.name())), "{m}");
        }
    }

    #[test]
    fn an_index_out_of_range_is_refused() {
        if built_apis().is_empty() {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "skipped an_index_out_of_range_is_refused: no GPU backend in this build"
            );
        }
        for api in built_apis() {
            let e = DeviceRequest::Gpu {
                api,
                index: Some(99),
            }
            .resolve()
            .unwrap_err();
            assert!(matches!(e, Error::Options(_)), "{e}");
            assert!(
                e.to_string().contains("99") || e.to_string().contains("no "),
                "{e}"
            );
        }
    }
}

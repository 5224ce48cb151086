//! What this CPU can run: the one place that asks it (found once per process).
//!
//! [`Isa`] picks the f32 kernels (the panel GEMM, and the 512-bit loops of attention, the stem
//! and `vmath`); [`Kernel`] picks the int8 GEMM's. [`report`] lists which kernels run here and
//! which this CPU lacks, for CI logs: a green run on a CPU without AMX or VNNI has not tested
//! those kernels.

use std::sync::OnceLock;

/// The instruction sets an f32 kernel can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The best f32 kernel this CPU runs.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| *Isa::available().last().expect("portable is always there"))
    }

    /// Every f32 kernel this CPU can run, slowest first (for tests and benchmarks).
    pub fn available() -> Vec<Isa> {
        let f = features();
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if f.avx2 && f.fma {
                v.push(Isa::Avx2);
            }
            if f.avx512f {
                v.push(Isa::Avx512);
            }
        }
        let _ = f;
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2+fma",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512f",
        }
    }
}

/// Whether the 512-bit f32 loops (attention, stem, `vmath`) can run.
pub fn avx512() -> bool {
    features().avx512f
}

/// The int8 GEMM kernels this build can run; [`Kernel::best`] picks one at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust (any CPU; the compiler vectorises what it can).
    Portable,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 (F, BW) with VNNI's `vpdpbusd`, plus the AVX2 set for quantizing.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// AMX-INT8 tiles for the products, AVX-512 for the scaling (and VNNI for a single step,
    /// where a 16-step tile would be mostly empty).
    #[cfg(target_arch = "x86_64")]
    Amx,
}

impl Kernel {
    /// The fastest int8 kernel this CPU runs (every int8 op asks, on every thread).
    pub fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            *Kernel::available()
                .last()
                .expect("portable is always there")
        })
    }

    /// Every int8 kernel this CPU can run, slowest first (for tests and benchmarks).
    pub fn available() -> Vec<Kernel> {
        let f = features();
        let mut v = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if f.avx2 && f.fma && f.f16c {
            v.push(Kernel::Avx2);
            if f.avx512f && f.avx512bw && f.avx512vnni {
                v.push(Kernel::Avx512Vnni);
                if f.amx_int8 {
                    v.push(Kernel::Amx);
                }
            }
        }
        let _ = f;
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => "avx512-vnni",
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => "amx-int8",
        }
    }
}

/// The CPU features our kernels use.
#[derive(Clone, Copy, Debug, Default)]
struct Features {
    avx2: bool,
    fma: bool,
    f16c: bool,
    avx512f: bool,
    avx512bw: bool,
    avx512vnni: bool,
    /// AMX-INT8, and the OS lets this process use the tile registers.
    amx_int8: bool,
}

/// This CPU's features, asked once (every kernel asks, on every thread).
fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    use std::arch::is_x86_feature_detected as has;
    let avx512f = has!("avx512f");
    Features {
        avx2: has!("avx2"),
        fma: has!("fma"),
        f16c: has!("f16c"),
        avx512f,
        avx512bw: has!("avx512bw"),
        avx512vnni: has!("avx512vnni"),
        amx_int8: amx_int8() && avx512f && request_tile_data(),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features::default()
}

/// Whether the CPU has AMX tiles with int8 products (CPUID leaf 7: AMX-TILE, AMX-INT8).
#[cfg(target_arch = "x86_64")]
fn amx_int8() -> bool {
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    leaf7.edx >> 24 & 1 == 1 && leaf7.edx >> 25 & 1 == 1
}

/// On Linux the tile data state must be requested once per process before any tile
/// instruction.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this request only changes the process's permitted xsave state.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

/// Which of our kernels this CPU runs and which it cannot, one line each, best first: AMX,
/// AVX-512 VNNI, AVX-512, AVX2, portable.
pub fn report() -> String {
    let (int8, f32s) = (Kernel::available(), Isa::available());
    let mut lines = Vec::new();
    let mut line = |name: &str, runs: bool, what: &str| {
        let verdict = if runs { "runs" } else { "NOT AVAILABLE" };
        lines.push(format!("{name:<14} {verdict:<13} {what}"));
    };
    #[cfg(target_arch = "x86_64")]
    {
        line(
            "amx-int8",
            int8.contains(&Kernel::Amx),
            "int8 GEMM on AMX tiles",
        );
        line(
            "avx512-vnni",
            int8.contains(&Kernel::Avx512Vnni),
            "int8 GEMM with vpdpbusd",
        );
        line(
            "avx512f",
            f32s.contains(&Isa::Avx512),
            "f32 panel GEMM, attention, stem, vmath in 512-bit registers",
        );
        line(
            "avx2",
            int8.contains(&Kernel::Avx2) && f32s.contains(&Isa::Avx2),
            "int8 and f32 GEMMs in 256-bit registers",
        );
    }
    line(
        "portable",
        int8.contains(&Kernel::Portable) && f32s.contains(&Isa::Portable),
        "every kernel in plain Rust",
    );
    let _ = (&int8, &f32s);
    format!(
        "kernels this CPU runs (best int8: {}, best f32: {}):\n{}\n",
        Kernel::best().name(),
        Isa::best().name(),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_every_kernel_and_the_best_runs() {
        let report = report();
        #[cfg(target_arch = "x86_64")]
        for name in ["amx-int8", "avx512-vnni", "avx512f", "avx2"] {
            assert!(report.contains(name), "{report}");
        }
        assert!(
            report
                .lines()
                .any(|l| l.starts_with("portable") && l.contains(" runs "))
        );
        assert_eq!(Kernel::best(), *Kernel::available().last().unwrap());
        assert_eq!(Isa::best(), *Isa::available().last().unwrap());
        println!("{report}");
    }
}

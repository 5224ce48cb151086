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

/// Defines a function whose body is compiled once per f32 instruction set (AVX-512, AVX2 + FMA
/// and the build's baseline) and runs the version [`Isa::best`] picks. For the portable loops
/// that the compiler vectorises (and the helpers they inline): built for the baseline alone they
/// would stay in 128-bit registers on every CPU, and `f32::mul_add` would be a call into libm
/// instead of one FMA instruction. Rust never contracts `a * b + c` into an FMA nor reorders a
/// float sum, so every version gives the same bits.
macro_rules! multiversioned {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match $crate::kernels::cpu::Isa::best() {
                    // SAFETY: Isa::best found these features on this CPU.
                    $crate::kernels::cpu::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::kernels::cpu::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::kernels::cpu::Isa::Portable => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversioned;

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

/// Windows enables the tile state for every process where it supports AMX (no request):
/// XCR0's bits 17 and 18 (XTILECFG, XTILEDATA) say whether it did.
#[cfg(all(target_arch = "x86_64", windows))]
fn request_tile_data() -> bool {
    #[target_feature(enable = "xsave")]
    fn xcr0() -> u64 {
        // SAFETY: XGETBV with ECX = 0 is valid wherever the OS enabled XSAVE, which this
        // function's target feature (checked by the caller) means.
        unsafe { std::arch::x86_64::_xgetbv(0) }
    }
    if !is_x86_feature_detected!("xsave") {
        return false;
    }
    // SAFETY: XSAVE is enabled (checked just above).
    let xcr0 = unsafe { xcr0() };
    xcr0 >> 17 & 3 == 3
}

#[cfg(all(target_arch = "x86_64", not(any(target_os = "linux", windows))))]
fn request_tile_data() -> bool {
    false
}

/// The instruction-set extensions this build knows by name: for each, whether the binary was
/// compiled to use it everywhere (`-C target-cpu`, see `.cargo/config.toml`; ggml is compiled
/// for the same set) and whether this CPU has it. `is_x86_feature_detected!` answers `true` at
/// compile time for a feature of the baseline, so on x86 the CPUID bit decides as well.
macro_rules! extensions {
    ($detected:ident: $($name:tt $($bit:expr)?),* $(,)?) => {
        vec![$(Extension {
            name: $name,
            in_baseline: cfg!(target_feature = $name),
            present: std::arch::$detected!($name) $(&& $bit)?,
        }),*]
    };
}

/// One instruction-set extension: in this binary's baseline, and on this CPU.
#[derive(Clone, Copy, Debug)]
pub struct Extension {
    pub name: &'static str,
    pub in_baseline: bool,
    pub present: bool,
}

/// Every extension this build knows by name, oldest first.
#[cfg(target_arch = "x86_64")]
pub fn extensions() -> Vec<Extension> {
    use std::arch::x86_64::{__cpuid, __cpuid_count, CpuidResult};
    let (top, top_ext) = (__cpuid(0).eax, __cpuid(0x8000_0000).eax);
    let leaf = |leaf: u32, sub: u32| {
        let known = if leaf >= 0x8000_0000 { top_ext } else { top };
        if leaf <= known {
            __cpuid_count(leaf, sub)
        } else {
            CpuidResult {
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 0,
            }
        }
    };
    let (l1, l7, l7s1, e1) = (leaf(1, 0), leaf(7, 0), leaf(7, 1), leaf(0x8000_0001, 0));
    let bit = |reg: u32, n: u32| (reg >> n) & 1 == 1;
    extensions!(is_x86_feature_detected:
        "sse3" bit(l1.ecx, 0), "ssse3" bit(l1.ecx, 9), "sse4.1" bit(l1.ecx, 19),
        "sse4.2" bit(l1.ecx, 20), "popcnt" bit(l1.ecx, 23), "cmpxchg16b" bit(l1.ecx, 13),
        "avx" bit(l1.ecx, 28), "avx2" bit(l7.ebx, 5), "fma" bit(l1.ecx, 12),
        "f16c" bit(l1.ecx, 29), "bmi1" bit(l7.ebx, 3), "bmi2" bit(l7.ebx, 8),
        "lzcnt" bit(e1.ecx, 5), "movbe" bit(l1.ecx, 22), "avx512f" bit(l7.ebx, 16),
        "avx512bw" bit(l7.ebx, 30), "avx512cd" bit(l7.ebx, 28), "avx512dq" bit(l7.ebx, 17),
        "avx512vl" bit(l7.ebx, 31), "avx512vnni" bit(l7.ecx, 11),
        "avx512bf16" bit(l7s1.eax, 5), "avx512vbmi" bit(l7.ecx, 1),
        "avx512vbmi2" bit(l7.ecx, 6), "avx512ifma" bit(l7.ebx, 21),
        "avx512bitalg" bit(l7.ecx, 12), "avx512vpopcntdq" bit(l7.ecx, 14),
        "avxvnni" bit(l7s1.eax, 4), "gfni" bit(l7.ecx, 8), "vaes" bit(l7.ecx, 9),
        "vpclmulqdq" bit(l7.ecx, 10), "pclmulqdq" bit(l1.ecx, 1), "aes" bit(l1.ecx, 25),
        "sha" bit(l7.ebx, 29), "adx" bit(l7.ebx, 19), "rdrand" bit(l1.ecx, 30),
        "rdseed" bit(l7.ebx, 18),
    )
}

/// Every extension this build knows by name, oldest first.
#[cfg(target_arch = "aarch64")]
pub fn extensions() -> Vec<Extension> {
    extensions!(is_aarch64_feature_detected:
        "neon", "fp16", "rdm", "lse", "crc", "aes", "sha2", "dotprod", "fhm", "i8mm", "bf16",
        "sve", "sve2",
    )
}

/// No extension is known by name on this architecture.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn extensions() -> Vec<Extension> {
    Vec::new()
}

/// The extensions this binary was compiled to use everywhere that this CPU lacks. Code outside
/// our run-time-dispatched kernels (the Rust code the compiler vectorises, and all of ggml) may
/// execute any baseline instruction, so with one missing the program would die of SIGILL; `main`
/// asks this first and stops with a message instead.
pub fn missing_baseline() -> Vec<&'static str> {
    extensions()
        .into_iter()
        .filter(|e| e.in_baseline && !e.present)
        .map(|e| e.name)
        .collect()
}

/// The CPU's model name: CPUID's brand string.
#[cfg(target_arch = "x86_64")]
pub fn brand() -> Option<String> {
    use std::arch::x86_64::__cpuid;
    if __cpuid(0x8000_0000).eax < 0x8000_0004 {
        return None;
    }
    let bytes: Vec<u8> = (0x8000_0002..=0x8000_0004u32)
        .flat_map(|leaf| {
            let r = __cpuid(leaf);
            [r.eax, r.ebx, r.ecx, r.edx]
                .into_iter()
                .flat_map(u32::to_le_bytes)
        })
        .collect();
    let s = String::from_utf8_lossy(&bytes);
    let s = s.trim_matches(char::from(0)).trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// The CPU's model name: not asked for outside x86.
#[cfg(not(target_arch = "x86_64"))]
pub fn brand() -> Option<String> {
    None
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

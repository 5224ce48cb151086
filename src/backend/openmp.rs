//! libgomp's barrier spinning, bounded in this process without re-executing it.
//!
//! ggml's threads meet at an OpenMP barrier after every op, and libgomp's default is to spin
//! there for up to 300,000 rounds before sleeping. On a busy machine the spinning thread burns
//! the core its descheduled partner needs: a 2-thread 110m transcription under load took 25 s
//! with the default and about 2 s with short spins. Measured both ways (docs/BENCHMARKS.md),
//! 5000 rounds beat 1000 on an idle machine (the decoder's small graphs come about 50 us apart,
//! and with 1000 rounds the second thread had gone to sleep by then: 0.34 -> 0.25 ms per step)
//! and under load (encoder -5 %, decoder -40 %); 10,000 and more made the decoder bimodal under
//! load.
//!
//! libgomp reads `GOMP_SPINCOUNT` once, in its constructor, which the dynamic loader runs
//! before any code of ours (a `.preinit_array` entry runs earlier, but libc's own constructor
//! then resets the environment it changed, so libgomp never sees the value). libgomp has no
//! API for the spin count either. What it does is call `getenv`, and a program's own
//! definition of a symbol comes first in the dynamic loader's lookup (with a static libgomp,
//! the linker binds it the same way). So the program defines `getenv`: libc's lookup, except
//! that an unset `GOMP_SPINCOUNT` reads as [`SPIN_COUNT`] unless the user chose a wait policy.
//! The environment itself is unchanged (child processes inherit what the user set).

/// Barrier spin rounds before a libgomp thread sleeps.
pub const SPIN_COUNT: &str = "5000";

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod interpose {
    use std::ffi::c_char;

    unsafe extern "C" {
        static environ: *const *const c_char;
    }

    /// [`super::SPIN_COUNT`], NUL-terminated for C.
    static SPIN_COUNT_C: [u8; 5] = *b"5000\0";

    /// The value of `name` in `environ`: what libc's `getenv` returns.
    ///
    /// # Safety
    /// `name` is a NUL-terminated string; `environ` is not being changed meanwhile (libc's
    /// own rule for `getenv`).
    unsafe fn lookup(name: &[u8]) -> *mut c_char {
        // SAFETY: `environ` is libc's NULL-terminated array of NUL-terminated strings (or
        // NULL after `clearenv`); each entry is read up to its terminator only.
        unsafe {
            let mut entry = environ;
            if entry.is_null() || name.is_empty() {
                return std::ptr::null_mut();
            }
            while !(*entry).is_null() {
                let s = *entry;
                let mut i = 0;
                while i < name.len() && *s.add(i) as u8 == name[i] {
                    i += 1;
                }
                if i == name.len() && *s.add(i) as u8 == b'=' {
                    return s.add(i + 1) as *mut c_char;
                }
                entry = entry.add(1);
            }
            std::ptr::null_mut()
        }
    }

    /// libc's `getenv` for every name but an unset `GOMP_SPINCOUNT` (see the module's note).
    ///
    /// # Safety
    /// As libc's `getenv`: `name` is a NUL-terminated string.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn getenv(name: *const c_char) -> *mut c_char {
        if name.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller passes a NUL-terminated string, as to libc's `getenv`.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
        // SAFETY: as this function's own contract.
        let found = unsafe { lookup(name) };
        if found.is_null()
            && name == b"GOMP_SPINCOUNT"
            // SAFETY: literal names.
            && unsafe { lookup(b"OMP_WAIT_POLICY").is_null() && lookup(b"OMP_WAIT_POLICY_ALL").is_null() }
        {
            return SPIN_COUNT_C.as_ptr() as *mut c_char;
        }
        found
    }

    /// Makes the linker keep [`getenv`] in the program (it is in a library archive, which only
    /// contributes what something refers to).
    pub fn keep() {
        let f: unsafe extern "C" fn(*const c_char) -> *mut c_char = getenv;
        std::hint::black_box(f);
    }
}

/// Puts the bounded spin count in force for a program: call it from `main` (any call keeps the
/// definition that libgomp reads its settings through in the program; it does nothing else).
/// Where libgomp is not glibc's, this does nothing.
pub fn bound_spinning() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    interpose::keep();
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::interpose::getenv;
    use std::ffi::{CStr, CString};

    fn get(name: &str) -> Option<String> {
        let name = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name; no test changes the environment.
        let p = unsafe { getenv(name.as_ptr()) };
        // SAFETY: a non-null answer points into `environ` or the static value.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned())
    }

    /// Every other name reads as libc reads it: set, unset, a prefix of a set name, empty.
    #[test]
    fn other_names_read_as_libc_reads_them() {
        for (name, value) in std::env::vars() {
            assert_eq!(get(&name), Some(value), "{name}");
        }
        assert_eq!(get("PARAKEET_SURELY_UNSET_VARIABLE"), None);
        let path = std::env::var("PATH").unwrap();
        assert_eq!(get("PATH"), Some(path));
        assert_eq!(get("PAT"), None);
        assert_eq!(get(""), None);
    }
}

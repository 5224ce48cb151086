//! Which of our CPU kernels this machine runs and which it lacks (AMX, AVX-512 VNNI, AVX-512,
//! AVX2, portable): CI prints it, so that a green run on a CPU without AMX or VNNI is not read
//! as a test of those kernels.
//!
//! `cargo run --example cpu_report`

fn main() {
    print!("{}", parakeet::kernels::cpu::report());
}

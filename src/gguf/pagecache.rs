//! The weights' pages: a model's weights stream from memory once per utterance (2.3 GB for the
//! 0.6b in f32), and through 4 KiB pages every 4 KiB costs a TLB miss and a page walk, which in
//! a virtual machine (nested paging) is itself a chain of memory reads: 2 MiB pages read the
//! mapping several times faster there (docs/BENCHMARKS.md, "Measurements behind code
//! comments").
//!
//! Linux maps a file with 2 MiB pages when its page cache holds 2 MiB folios (ext4 since 6.16,
//! xfs, ...) and the mapping is 2 MiB-aligned; the page cache creates such folios when a
//! mapping advised `MADV_HUGEPAGE` faults in pages that are not cached yet. A file cached in
//! small folios (just written by `parakeet convert`, read by an older version, or partly
//! evicted and read back while memory was fragmented) stays so until it leaves the cache, so
//! [`populate`] finds the 64 MiB pieces that are not in 2 MiB pages and re-reads them, once a
//! 2 MiB probe has shown that this helps; later loads find the file cached in 2 MiB folios.
//! Everything here is a hint: where it cannot help (another kernel, file system or OS,
//! transparent huge pages off, the file mapped by another process) the pages stay as they are.

use memmap2::Mmap;
use std::fs::File;

/// Smaller files fit the TLB's reach of small pages well enough to skip the probe.
#[cfg(target_os = "linux")]
const MIN_BYTES: usize = 64 << 20;
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

/// Ask for 2 MiB pages on the mapping, before any page of it is touched.
pub(crate) fn advise_huge(map: &Mmap) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

/// Map every page of `map` (the whole of `file`, from offset 0) now, with 2 MiB pages where
/// the kernel can give them; see the module docs.
pub(crate) fn populate(map: &Mmap, file: &File) {
    #[cfg(target_os = "linux")]
    {
        let _ = map.advise(memmap2::Advice::PopulateRead);
        let start = map.as_ptr() as usize;
        // The mapping starts at file offset 0: 2 MiB pages can only map it from a 2 MiB-aligned
        // address (which Linux picks for large file mappings).
        if map.len() < MIN_BYTES || !start.is_multiple_of(HUGE) || !transparent_huge_pages() {
            return;
        }
        let pages = Pages { map, file, start };
        // Nearly all of it already (the file's tail past the last 2 MiB boundary cannot be).
        if pages.huge().is_none_or(|b| b >= map.len() - map.len() / 16) {
            return;
        }
        pages.upgrade();
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (map, file);
}

/// The weights' mapping, for finding and re-reading the parts held in small folios.
#[cfg(target_os = "linux")]
struct Pages<'a> {
    map: &'a Mmap,
    file: &'a File,
    start: usize,
}

/// Checked and re-read by pieces: a partly evicted file (memory pressure) is re-read where it
/// lost its 2 MiB folios, not whole.
#[cfg(target_os = "linux")]
const PIECE: usize = 64 << 20;

#[cfg(target_os = "linux")]
impl Pages<'_> {
    /// Bytes of the mapping mapped with 2 MiB pages now.
    fn huge(&self) -> Option<usize> {
        huge_mapped_bytes(self.start)
    }

    /// Re-reads every piece not (nearly) all in 2 MiB pages, once a 2 MiB probe has shown the
    /// kernel gives a re-read chunk a 2 MiB page; stops at the first thing that fails, and at
    /// the first piece a re-read leaves mostly in small pages (memory too fragmented now: so
    /// that a load re-reads at most one piece in vain, not the whole file every time).
    fn upgrade(&self) -> Option<()> {
        let len = self.map.len();
        let mut capable = false;
        for offset in (0..len).step_by(PIECE) {
            let piece = PIECE.min(len - offset);
            // How much of the piece is huge: unmap it (the cache keeps it) and see what the
            // mapping lost.
            let before = self.huge()?;
            self.unmap(offset, piece).then_some(())?;
            let rest = self.huge()?;
            let huge = before.checked_sub(rest)?;
            if huge + HUGE >= piece {
                self.map_in(offset, piece).then_some(())?;
                continue;
            }
            if !capable {
                (self.evict(offset, HUGE) && self.map_in(offset, HUGE)).then_some(())?;
                capable = self.huge()? >= rest + HUGE;
                if !capable {
                    self.map_in(offset, piece);
                    return None;
                }
            }
            (self.evict(offset, piece) && self.map_in(offset, piece)).then_some(())?;
            if self.huge()? < rest + piece / 2 {
                return None;
            }
        }
        Some(())
    }

    /// Drops `len` bytes at `offset` from our page tables (the page cache keeps them).
    fn unmap(&self, offset: usize, len: usize) -> bool {
        // SAFETY: MADV_DONTNEED on a private, read-only file mapping we never write only zaps
        // page-table entries: the next read maps the same file bytes again.
        unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
        }
        .is_ok()
    }

    /// Drops `len` bytes at `offset` from the page cache (unmapped ones only: see [`unmap`]).
    fn evict(&self, offset: usize, len: usize) -> bool {
        use std::os::fd::AsRawFd;
        self.unmap(offset, len)
            // SAFETY: a plain syscall on an open descriptor.
            && unsafe {
                libc::posix_fadvise(
                    self.file.as_raw_fd(),
                    offset as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            } == 0
    }

    /// Maps `len` bytes at `offset` (reading what the cache lacks, into folios the mapping's
    /// advice chooses).
    fn map_in(&self, offset: usize, len: usize) -> bool {
        self.map
            .advise_range(memmap2::Advice::PopulateRead, offset, len)
            .is_ok()
    }
}

/// Whether transparent huge pages may be used at all (`never` turns them off).
#[cfg(target_os = "linux")]
fn transparent_huge_pages() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| !s.contains("[never]"))
}

/// Bytes of the file mapping that starts at `start` which the kernel maps with 2 MiB pages
/// (`FilePmdMapped` in /proc/self/smaps); None if it cannot be read.
#[cfg(target_os = "linux")]
fn huge_mapped_bytes(start: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    file_pmd_mapped(&smaps, start)
}

/// The `FilePmdMapped` field of the smaps entry of the mapping starting at `start`, in bytes.
#[cfg(target_os = "linux")]
fn file_pmd_mapped(smaps: &str, start: usize) -> Option<usize> {
    let header = format!("{start:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&header));
    lines.next()?;
    for line in lines {
        if let Some(rest) = line.strip_prefix("FilePmdMapped:") {
            let kib: usize = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            return Some(kib * 1024);
        }
        // The next mapping's header: address range, then permissions.
        if line.split_whitespace().next().is_some_and(|w| {
            w.contains('-') && w.split('-').all(|h| usize::from_str_radix(h, 16).is_ok())
        }) {
            return None;
        }
    }
    None
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0021000 r--p 00000000 fd:00 1 /usr/bin/parakeet
Size:                132 kB
FilePmdMapped:         0 kB
7f4a9f400000-7f4b2e000000 r--p 00000000 fd:00 2 /models/tdt_0.6b_v2.gguf
Size:            2339840 kB
Rss:             2339840 kB
FilePmdMapped:   2336768 kB
7f4b2e000000-7f4b2e100000 rw-p 00000000 00:00 0
Size:               1024 kB
";

    #[test]
    fn smaps_field_of_the_right_mapping() {
        assert_eq!(file_pmd_mapped(SMAPS, 0x7f4a9f400000), Some(2336768 * 1024));
        assert_eq!(file_pmd_mapped(SMAPS, 0x55d0c0000000), Some(0));
        // No such mapping; a mapping without the field does not borrow the next one's.
        assert_eq!(file_pmd_mapped(SMAPS, 0x1000), None);
        assert_eq!(file_pmd_mapped(SMAPS, 0x7f4b2e000000), None);
    }

    /// The pieces re-read (unmapped, dropped from the page cache, mapped again) still read
    /// the file's bytes, whatever the kernel gives.
    #[test]
    fn populate_keeps_the_files_bytes() {
        use std::io::Write;
        let len = MIN_BYTES + 3 * HUGE + 4096 + 12;
        let word = |i: usize| (i as u32).wrapping_mul(2654435761);
        let bytes: Vec<u8> = (0..len / 4 + 1)
            .flat_map(|i| word(i).to_le_bytes())
            .collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&bytes[..len]).unwrap();
        file.as_file().sync_all().unwrap();
        let file = File::open(file.path()).unwrap();
        // SAFETY: a read-only mapping of our own temporary file, which nothing else writes.
        let map = unsafe { Mmap::map(&file) }.unwrap();
        advise_huge(&map);
        populate(&map, &file);
        assert!(map[..] == bytes[..len], "the mapping's bytes changed");
        // The same again, now that the pages may be in 2 MiB folios.
        populate(&map, &file);
        assert!(map[..] == bytes[..len], "the mapping's bytes changed");
    }

    #[test]
    fn this_process_reads_its_own_smaps() {
        // Any file mapping of ours has an entry; the field exists on kernels since 4.8.
        let file = File::open("/proc/self/exe").unwrap();
        // SAFETY: read-only mapping of our own executable, dropped before the test ends.
        let map = unsafe { Mmap::map(&file) }.unwrap();
        let bytes = huge_mapped_bytes(map.as_ptr() as usize);
        assert!(bytes.is_some_and(|b| b <= map.len()), "{bytes:?}");
    }
}

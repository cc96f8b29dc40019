use std::collections::BTreeMap;

const PAGE: usize = 4096;

/// A sparse in-memory disk image: 4 KiB pages, absent pages read as zeros.
/// Invariant: no stored page is all zeros, so two images are equal iff their maps are equal.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SparseImage {
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl SparseImage {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) {
        let mut done = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (page, within) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let n = (PAGE - within).min(buf.len() - done);
            match self.pages.get(&page) {
                Some(p) => buf[done..done + n].copy_from_slice(&p[within..within + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let (page, within) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let n = (PAGE - within).min(data.len() - done);
            let src = &data[done..done + n];
            match self.pages.get_mut(&page) {
                Some(p) => {
                    p[within..within + n].copy_from_slice(src);
                    // Only zeros written can leave the page all zeros: a write holding any
                    // other byte skips the scan of the whole page.
                    if src.iter().all(|&b| b == 0) && p.iter().all(|&b| b == 0) {
                        self.pages.remove(&page);
                    }
                }
                None if src.iter().all(|&b| b == 0) => {}
                None => {
                    let mut p = vec![0u8; PAGE].into_boxed_slice();
                    p[within..within + n].copy_from_slice(src);
                    self.pages.insert(page, p);
                }
            }
            done += n;
        }
    }

    /// Bytes held in memory (non-zero pages).
    pub fn resident_bytes(&self) -> u64 {
        (self.pages.len() * PAGE) as u64
    }

    /// Offsets of the pages that differ between two images, for test failure messages.
    pub fn differing_pages(&self, other: &Self) -> Vec<u64> {
        let mut keys: Vec<u64> = self
            .pages
            .keys()
            .chain(other.pages.keys())
            .copied()
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .filter(|k| self.pages.get(k) != other.pages.get(k))
            .map(|k| k * PAGE as u64)
            .collect()
    }
}

impl std::fmt::Debug for SparseImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SparseImage({} non-zero pages)", self.pages.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The invariant holds whichever bytes a write brings: zeros over a page's last non-zero
    /// bytes drop it, zeros beside them keep it, and the image equals one never written.
    #[test]
    fn a_page_zeroed_by_writes_is_dropped() {
        let mut img = SparseImage::new();
        img.write(100, &[1, 2, 3]);
        img.write(5000, &[4]);
        assert_eq!(img.resident_bytes(), 2 * PAGE as u64);
        img.write(0, &[0; 50]);
        assert_eq!(img.resident_bytes(), 2 * PAGE as u64);
        img.write(101, &[0, 0]);
        img.write(100, &[0]);
        assert_eq!(img.resident_bytes(), PAGE as u64);
        // A write across both pages, zeros on the first and not on the second: the second
        // page is kept.
        img.write(4000, &[0; 200]);
        img.write(4090, &[0, 0, 0, 0, 0, 0, 9]);
        assert_eq!(img.resident_bytes(), PAGE as u64);
        img.write(4096, &[0; 1000]);
        assert_eq!(img, SparseImage::new());
        let mut b = [7u8; 16];
        img.read(4090, &mut b);
        assert_eq!(b, [0; 16]);
    }
}

/// Sorted, disjoint, non-adjacent byte ranges `(offset, len)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u32, u32)>,
}

impl RangeSet {
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| u64::from(r.1)).sum()
    }

    /// Adds `[off, off+len)`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, off: u32, len: u32) {
        if len == 0 {
            return;
        }
        let (mut start, mut end) = (off, off + len);
        // First range that ends at or after `start` (could touch us).
        let i = self.ranges.partition_point(|&(o, l)| o + l < start);
        let mut j = i;
        while j < self.ranges.len() && self.ranges[j].0 <= end {
            start = start.min(self.ranges[j].0);
            end = end.max(self.ranges[j].0 + self.ranges[j].1);
            j += 1;
        }
        self.ranges.splice(i..j, [(start, end - start)]);
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((0u32..200, 0u32..40), 0..30)) {
            let mut set = RangeSet::default();
            let mut bits = [false; 240];
            for (o, l) in ops {
                set.insert(o, l);
                for b in &mut bits[o as usize..(o + l) as usize] { *b = true; }
            }
            let mut from_set = [false; 240];
            let r = set.ranges();
            for w in r.windows(2) { prop_assert!(w[0].0 + w[0].1 < w[1].0); }
            for &(o, l) in r { for b in &mut from_set[o as usize..(o + l) as usize] { *b = true; } }
            prop_assert_eq!(bits, from_set);
        }
    }
}

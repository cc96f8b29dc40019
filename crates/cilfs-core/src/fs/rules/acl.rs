//! POSIX ACLs: the two `system.posix_acl_*` xattrs in Linux's xattr format, validated before
//! they are stored, kept in step with the mode, and inherited from a directory's default ACL.
//! The kernel enforces them (FUSE_POSIX_ACL implies default_permissions): the filesystem's part
//! is to store only valid ACLs, keep mode and ACL saying the same thing both ways, and give new
//! files their parent's default ACL.
//!
//! Format (little endian): version u32 = 2, then entries of (tag u16, perm u16, id u32), sorted
//! by tag and, for named users and groups, by id.

use crate::fs::error::{FsError, FsResult};

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;
/// The id stored with entries that name no one (ACL_UNDEFINED_ID).
const NO_ID: u32 = u32::MAX;
/// More entries than Linux accepts in one xattr (its limit is what fits in a page).
const MAX_ENTRIES: usize = 1024;

/// Which of the two ACLs an xattr name is, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Access,
    Default,
}

pub fn kind_of(name: &[u8]) -> Option<Kind> {
    match name {
        ACCESS => Some(Kind::Access),
        DEFAULT => Some(Kind::Default),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A valid ACL: exactly one owner, owning-group and other entry, a mask whenever named entries
/// exist, named entries unique and sorted, permissions within rwx.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parses and validates an xattr value. `Ok(None)`: a header with no entries, which Linux
    /// takes as "remove the ACL".
    pub fn parse(v: &[u8]) -> FsResult<Option<Acl>> {
        let bad = FsError::Invalid;
        if v.len() < 4 || (v.len() - 4) % 8 != 0 {
            return Err(bad("ACL value of a wrong length"));
        }
        if u32::from_le_bytes([v[0], v[1], v[2], v[3]]) != VERSION {
            return Err(bad("ACL of an unknown version"));
        }
        let n = (v.len() - 4) / 8;
        if n == 0 {
            return Ok(None);
        }
        if n > MAX_ENTRIES {
            return Err(bad("ACL with too many entries"));
        }
        let entries: Vec<Entry> = v[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        let acl = Acl { entries };
        acl.validate()?;
        Ok(Some(acl.canonical()))
    }

    fn validate(&self) -> FsResult<()> {
        let bad = FsError::Invalid;
        let (mut prev_tag, mut prev_id) = (0u16, None::<u32>);
        let mut named = false;
        let count = |t: u16| self.entries.iter().filter(|e| e.tag == t).count();
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err(bad("ACL entry with permissions beyond rwx"));
            }
            if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag) {
                return Err(bad("ACL entry of an unknown type"));
            }
            if e.tag < prev_tag {
                return Err(bad("ACL entries out of order"));
            }
            if e.tag == USER || e.tag == GROUP {
                named = true;
                if e.tag == prev_tag && prev_id.is_some_and(|p| e.id <= p) {
                    return Err(bad("ACL names a user or group twice, or out of order"));
                }
                prev_id = Some(e.id);
            } else {
                prev_id = None;
            }
            prev_tag = e.tag;
        }
        if count(USER_OBJ) != 1 || count(GROUP_OBJ) != 1 || count(OTHER) != 1 {
            return Err(bad("ACL without exactly one owner, group and other entry"));
        }
        match count(MASK) {
            0 if named => Err(bad("ACL with named entries and no mask")),
            0 | 1 => Ok(()),
            _ => Err(bad("ACL with two masks")),
        }
    }

    /// Entries that name no one carry the undefined id, as Linux writes them.
    fn canonical(mut self) -> Acl {
        for e in &mut self.entries {
            if e.tag != USER && e.tag != GROUP {
                e.id = NO_ID;
            }
        }
        self
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn perm_of(&self, tag: u16) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map(|e| u32::from(e.perm))
    }

    fn set_perm(&mut self, tag: u16, perm: u32) {
        for e in self.entries.iter_mut().filter(|e| e.tag == tag) {
            e.perm = (perm & 7) as u16;
        }
    }

    /// Only the three entries the mode bits hold: the ACL says nothing the mode does not.
    pub fn is_minimal(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// The permission bits the ACL gives the mode: owner, mask (or owning group), other.
    pub fn mode_bits(&self) -> u32 {
        let group = self
            .perm_of(MASK)
            .or_else(|| self.perm_of(GROUP_OBJ))
            .unwrap_or(0);
        (self.perm_of(USER_OBJ).unwrap_or(0) << 6) | (group << 3) | self.perm_of(OTHER).unwrap_or(0)
    }

    /// chmod: the owner, mask (or owning group) and other entries take the new mode's bits.
    pub fn chmod(&mut self, mode: u32) {
        self.set_perm(USER_OBJ, mode >> 6);
        if self.perm_of(MASK).is_some() {
            self.set_perm(MASK, mode >> 3);
        } else {
            self.set_perm(GROUP_OBJ, mode >> 3);
        }
        self.set_perm(OTHER, mode);
    }

    /// A new file's access ACL from its parent's default ACL and the mode it was created with:
    /// each of owner, mask (or owning group) and other keeps only what both allow, and the mode
    /// takes the result. Returns the new mode (type and special bits kept).
    pub fn create_mask(&mut self, mode: u32) -> u32 {
        let owner = self.perm_of(USER_OBJ).unwrap_or(0) & (mode >> 6);
        let group_tag = if self.perm_of(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        let group = self.perm_of(group_tag).unwrap_or(0) & (mode >> 3);
        let other = self.perm_of(OTHER).unwrap_or(0) & mode;
        self.set_perm(USER_OBJ, owner);
        self.set_perm(group_tag, group);
        self.set_perm(OTHER, other);
        (mode & !0o777) | ((owner & 7) << 6) | ((group & 7) << 3) | (other & 7)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(t, p, i) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&i.to_le_bytes());
        }
        v
    }

    const X: u32 = NO_ID;

    #[test]
    fn valid_acls_parse_and_round_trip() {
        let v = acl(&[
            (USER_OBJ, 6, X),
            (USER, 4, 65534),
            (GROUP_OBJ, 4, X),
            (GROUP, 5, 100),
            (MASK, 5, X),
            (OTHER, 0, X),
        ]);
        let a = Acl::parse(&v).unwrap().unwrap();
        assert_eq!(a.encode(), v);
        assert!(!a.is_minimal());
        assert_eq!(a.mode_bits(), 0o650);
        let m = Acl::parse(&acl(&[(USER_OBJ, 7, X), (GROUP_OBJ, 5, X), (OTHER, 1, X)]))
            .unwrap()
            .unwrap();
        assert!(m.is_minimal());
        assert_eq!(m.mode_bits(), 0o751);
        assert_eq!(Acl::parse(&acl(&[])).unwrap(), None);
    }

    #[test]
    fn malformed_acls_are_refused() {
        let bad: Vec<Vec<u8>> = vec![
            vec![],
            vec![2, 0, 0],
            acl(&[(USER_OBJ, 6, X), (GROUP_OBJ, 4, X), (OTHER, 4, X)])[..11].to_vec(),
            {
                let mut v = acl(&[(USER_OBJ, 6, X), (GROUP_OBJ, 4, X), (OTHER, 4, X)]);
                v[0] = 1;
                v
            },
            acl(&[(USER_OBJ, 6, X), (OTHER, 4, X)]),
            acl(&[(USER_OBJ, 6, X), (GROUP_OBJ, 4, X)]),
            acl(&[
                (USER_OBJ, 6, X),
                (USER_OBJ, 6, X),
                (GROUP_OBJ, 4, X),
                (OTHER, 4, X),
            ]),
            acl(&[(USER_OBJ, 8, X), (GROUP_OBJ, 4, X), (OTHER, 4, X)]),
            acl(&[
                (USER_OBJ, 6, X),
                (GROUP_OBJ, 4, X),
                (0x40, 4, X),
                (OTHER, 4, X),
            ]),
            acl(&[(GROUP_OBJ, 4, X), (USER_OBJ, 6, X), (OTHER, 4, X)]),
            // A named user and no mask.
            acl(&[
                (USER_OBJ, 6, X),
                (USER, 4, 7),
                (GROUP_OBJ, 4, X),
                (OTHER, 4, X),
            ]),
            // The same user twice, and out of order.
            acl(&[
                (USER_OBJ, 6, X),
                (USER, 4, 7),
                (USER, 4, 7),
                (GROUP_OBJ, 4, X),
                (MASK, 4, X),
                (OTHER, 4, X),
            ]),
            acl(&[
                (USER_OBJ, 6, X),
                (USER, 4, 9),
                (USER, 4, 7),
                (GROUP_OBJ, 4, X),
                (MASK, 4, X),
                (OTHER, 4, X),
            ]),
            acl(&[
                (USER_OBJ, 6, X),
                (GROUP_OBJ, 4, X),
                (MASK, 4, X),
                (MASK, 4, X),
                (OTHER, 4, X),
            ]),
        ];
        for (i, v) in bad.iter().enumerate() {
            assert!(
                matches!(Acl::parse(v), Err(FsError::Invalid(_))),
                "case {i} accepted"
            );
        }
    }

    #[test]
    fn chmod_and_create_keep_mode_and_acl_in_step() {
        let mut a = Acl::parse(&acl(&[
            (USER_OBJ, 7, X),
            (USER, 7, 65534),
            (GROUP_OBJ, 5, X),
            (MASK, 7, X),
            (OTHER, 5, X),
        ]))
        .unwrap()
        .unwrap();
        a.chmod(0o640);
        assert_eq!(a.mode_bits(), 0o640);
        // The mask, not the owning group, took the group bits.
        assert_eq!(a.perm_of(GROUP_OBJ), Some(5));
        assert_eq!(a.perm_of(MASK), Some(4));
        // New file, mode 0666 asked for: owner rw, mask rw, other r.
        let mut d = Acl::parse(&acl(&[
            (USER_OBJ, 7, X),
            (USER, 7, 65534),
            (GROUP_OBJ, 5, X),
            (MASK, 7, X),
            (OTHER, 5, X),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(d.create_mask(0o100_666), 0o100_664);
        assert_eq!(d.mode_bits(), 0o664);
        assert_eq!(
            d.perm_of(USER),
            Some(7),
            "named entries are left to the mask"
        );
    }
}

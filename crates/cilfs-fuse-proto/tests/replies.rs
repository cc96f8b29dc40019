//! Reply, listing and notification encoders: limits and refusals.

mod common;

use cilfs_fuse_proto::*;
use common::le_u32;

#[test]
fn dirents_stop_at_the_requested_size() {
    // 24 + 5 = 29 -> 32 bytes per entry; 100 bytes hold three.
    let mut d = Dirents::new(100);
    let mut pushed = 0;
    for i in 0..10u64 {
        if !d.push(i + 2, i + 1, 8, b"entry").unwrap() {
            break;
        }
        pushed += 1;
    }
    assert_eq!(pushed, 3);
    assert_eq!(d.len(), 96);
    // A refused entry leaves the buffer as it was (a 1-byte name takes 32 bytes too; 4 are left).
    assert!(!d.push(1, 1, 8, b"x").unwrap());
    assert_eq!(d.len(), 96);

    // An entry that fits exactly is taken.
    let mut exact = Dirents::new(32);
    assert!(exact.push(1, 1, 8, b"12345678").unwrap());
    assert!(!exact.push(1, 2, 8, b"1").unwrap());
    assert_eq!(exact.len(), 32);

    // Nothing fits in a zero-size request.
    let mut none = Dirents::new(0);
    assert!(!none.push(1, 1, 8, b"a").unwrap());
    assert!(none.is_empty());
}

#[test]
fn direntsplus_stop_at_the_requested_size() {
    // 128 + 24 + 1 -> 160 bytes per entry.
    let mut d = DirentsPlus::new(319);
    let e = EntryOut::default();
    assert!(d.push(&e, 1, 1, 8, b"a").unwrap());
    assert!(!d.push(&e, 2, 2, 8, b"b").unwrap());
    assert_eq!(d.len(), 160);
    let reply = Reply::dirents_plus(5, &d).unwrap();
    assert_eq!(le_u32(reply.as_bytes(), 0), 16 + 160);
}

#[test]
fn dirent_names_the_kernel_would_refuse_are_refused() {
    let mut d = Dirents::new(1 << 20);
    for bad in [&b""[..], b"a/b", b"a\0b", b"/"] {
        assert_eq!(
            d.push(1, 1, 8, bad).unwrap_err(),
            ProtoError::BadName {
                what: "fuse_dirent"
            },
            "{bad:?}"
        );
    }
    let long = vec![b'n'; NAME_MAX + 1];
    assert!(matches!(
        d.push(1, 1, 8, &long).unwrap_err(),
        ProtoError::NameTooLong { len, max: NAME_MAX, .. } if len == NAME_MAX + 1
    ));
    assert!(d.push(1, 1, 8, &long[..NAME_MAX]).unwrap());
    assert!(d.push(1, 2, 8, b"..").unwrap());
    let mut p = DirentsPlus::new(1 << 20);
    assert!(p.push(&EntryOut::default(), 1, 1, 8, b"a/b").is_err());
}

#[test]
fn an_empty_listing_is_a_bare_header() {
    let d = Dirents::new(4096);
    let r = Reply::dirents(3, &d).unwrap();
    assert_eq!(r.as_bytes().len(), 16);
    assert_eq!(le_u32(r.as_bytes(), 0), 16);
}

#[test]
fn notification_names_are_checked() {
    let long = vec![b'n'; NAME_MAX + 1];
    assert!(matches!(
        Notification::inval_entry(1, &long, 0).unwrap_err(),
        ProtoError::NameTooLong { .. }
    ));
    assert!(Notification::inval_entry(1, &long[..NAME_MAX], 0).is_ok());
    for bad in [&b""[..], b"x/y", b"x\0"] {
        assert!(Notification::inval_entry(1, bad, 0).is_err(), "{bad:?}");
        assert!(Notification::delete(1, 2, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn reply_header_for_a_scattered_payload() {
    let h = reply_header(11, 4096).unwrap();
    assert_eq!(
        h,
        OutHeader {
            len: 16 + 4096,
            error: 0,
            unique: 11
        }
    );
    assert!(matches!(
        reply_header(1, u32::MAX as usize).unwrap_err(),
        ProtoError::TooLong { .. }
    ));
}

//! Sizes on the command line: `4096`, `64k`, `64M`, `1G`, `2GiB`, `1.5G`; suffixes are binary,
//! as in mkfs.xfs and truncate. A fraction is exact in decimal and rounded down to a whole byte
//! (`0.1G` is 107374182 bytes); whoever takes the size rounds it to its own unit after that, as
//! mkfs rounds a filesystem down to whole blocks.

/// Decimals after the point: enough for any byte of a petabyte, few enough for exact arithmetic.
const MAX_DECIMALS: usize = 18;

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let num_end = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(num_end);
    let not_a_size = || format!("'{s}' is not a size (examples: 4096, 64k, 64M, 1.5G)");
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(not_a_size());
    }
    let too_large = || format!("'{s}' is too large");
    // All digits: parsing fails only by overflow.
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => {
            return Err(format!(
                "'{s}': unknown size suffix (use k, M, G, T or P, as in 64k or 1.5G)"
            ))
        }
    };
    if shift == 0 && !frac.is_empty() {
        return Err(format!(
            "'{s}': a number of bytes has no fraction (a fraction takes a suffix, as in 1.5G)"
        ));
    }
    if frac.len() > MAX_DECIMALS {
        return Err(format!(
            "'{s}': more than {MAX_DECIMALS} decimals after the point"
        ));
    }
    let unit = 1u128 << shift;
    // frac / 10^decimals of a unit, exactly, rounded down: below 10^18 * 2^50 < 2^110.
    let frac_bytes = if frac.is_empty() {
        0
    } else {
        let digits: u128 = frac.parse().map_err(|_| not_a_size())?;
        digits * unit / 10u128.pow(frac.len() as u32)
    };
    let bytes = whole
        .checked_mul(unit)
        .and_then(|b| b.checked_add(frac_bytes))
        .ok_or_else(too_large)?;
    u64::try_from(bytes).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999P").is_err());
        assert!(parse_size("16384P").is_err());
        assert!(parse_size("18446744073709551616")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("999999999999999999999999999999999999999999P").is_err());
        assert_eq!(parse_size("16383P"), Ok(16383 << 50));
    }

    #[test]
    fn fractions_are_exact_and_round_down_to_a_byte() {
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert_eq!(parse_size(".5M"), Ok(1 << 19));
        assert_eq!(parse_size("2.M"), Ok(2 << 20));
        assert_eq!(parse_size("1.25GiB"), Ok(5 << 28));
        // 0.1 GiB is 107374182.4 bytes.
        assert_eq!(parse_size("0.1G"), Ok(107_374_182));
        assert_eq!(parse_size("0.000000000000000001P"), Ok(0));
        assert_eq!(parse_size("15.999999999999999999P"), Ok((16 << 50) - 1));
        for bad in [
            "1.5",
            "1.5b",
            ".",
            ".k",
            "1..5G",
            "1.2.3G",
            "1.5X",
            "1.0000000000000000001P",
            "16383.99999P0",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
        assert!(parse_size("16384.5P").is_err());
        assert!(parse_size("1.5").unwrap_err().contains("no fraction"));
    }
}

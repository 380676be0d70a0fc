//! Byte counts of Kubernetes quantities (`8Gi`, `500M`, `1.5Gi`, `2e9`), for
//! comparing volume sizes and deriving a quota from one. The syntax is the
//! one the API server accepts for a quantity (Kubernetes
//! `apimachinery/pkg/api/resource`: a decimal number, then a binary suffix
//! `Ki`…`Ei`, a decimal suffix `k`, `M`…`E` or an exponent `e<n>`); a value
//! with a fraction of a byte is rounded up, as the API server rounds a
//! quantity's integer value.

/// `bytes` as a person reads a volume size: the largest binary suffix that
/// divides it exactly (`2Gi`, `1536Mi`), else a plain count (`1000 bytes`).
pub fn display(bytes: i64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    SUFFIXES
        .iter()
        .find(|(_, shift)| bytes != 0 && bytes % (1i64 << shift) == 0)
        .map(|(suffix, shift)| format!("{}{suffix}", bytes >> shift))
        .unwrap_or_else(|| format!("{bytes} bytes"))
}

/// The number of bytes `quantity` stands for, or why it is not a size.
pub fn bytes(quantity: &str) -> Result<i64, String> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(format!("{quantity:?} is not a quantity"));
    }
    if !(whole.bytes().all(|b| b.is_ascii_digit()) && fraction.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{quantity:?} is not a quantity"));
    }
    let (mul, exp10) = multiplier(suffix).ok_or_else(|| {
        format!("{quantity:?} has an unknown suffix {suffix:?} (Ki, Mi, Gi, Ti, k, M, G, T, e<n>)")
    })?;
    let too_big = || format!("{quantity:?} is too large for a size");
    let digits: u128 = format!("{whole}{fraction}")
        .parse::<u128>()
        .map_err(|_| too_big())?;
    // value = digits × mul × 10^exp10 / 10^len(fraction), rounded up.
    let shift = exp10 - fraction.len() as i32;
    let scaled = digits.checked_mul(mul).ok_or_else(too_big)?;
    let value = if shift >= 0 {
        10u128
            .checked_pow(shift as u32)
            .and_then(|p| scaled.checked_mul(p))
            .ok_or_else(too_big)?
    } else {
        let p = 10u128.checked_pow((-shift) as u32).ok_or_else(too_big)?;
        scaled.div_ceil(p)
    };
    i64::try_from(value).map_err(|_| too_big())
}

/// (binary multiplier, decimal exponent) of a suffix.
fn multiplier(suffix: &str) -> Option<(u128, i32)> {
    let binary = |n: u32| Some((1u128 << (10 * n), 0));
    match suffix {
        "" => Some((1, 0)),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        "m" => Some((1, -3)),
        "k" => Some((1, 3)),
        "M" => Some((1, 6)),
        "G" => Some((1, 9)),
        "T" => Some((1, 12)),
        "P" => Some((1, 15)),
        "E" => Some((1, 18)),
        _ => {
            let exp = suffix.strip_prefix(['e', 'E'])?;
            let n: i32 = exp.parse().ok()?;
            (-30..=30).contains(&n).then_some((1, n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{bytes, display};

    #[test]
    fn sizes_are_shown_with_the_largest_exact_binary_suffix() {
        for (b, want) in [
            (1 << 30, "1Gi"),
            (2 << 30, "2Gi"),
            (1536 << 20, "1536Mi"),
            (8 << 20, "8Mi"),
            (1000, "1000 bytes"),
            (0, "0 bytes"),
        ] {
            assert_eq!(display(b), want, "{b}");
        }
    }

    #[test]
    fn sizes_in_every_suffix_are_counted_in_bytes() {
        for (q, want) in [
            ("8Gi", 8 << 30),
            ("1Gi", 1 << 30),
            ("512Mi", 512 << 20),
            ("1.5Gi", 3 << 29),
            ("20G", 20_000_000_000),
            ("500M", 500_000_000),
            ("1k", 1000),
            ("4096", 4096),
            ("2e9", 2_000_000_000),
            ("1E3", 1000),
            ("+2Ki", 2048),
            (".5Ki", 512),
            ("1500m", 2),
            ("1Ti", 1 << 40),
        ] {
            assert_eq!(bytes(q), Ok(want), "{q}");
        }
    }

    #[test]
    fn what_is_not_a_size_says_why() {
        for (q, why) in [
            ("lots", "is not a quantity"),
            ("", "is not a quantity"),
            ("-5Gi", "is not a quantity"),
            ("8Gb", "unknown suffix \"Gb\""),
            ("1.2.3Gi", "is not a quantity"),
            ("9Ei", "too large"),
        ] {
            let err = bytes(q).unwrap_err();
            assert!(err.contains(why), "{q}: {err}");
        }
    }
}

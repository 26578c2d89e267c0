//! Byte counts as operators write them on the command line and in option files: `268435456`,
//! `256M`, `1G` (binary suffixes K, M, G).

/// A positive byte count, optionally with a binary suffix.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let (digits, unit) = match trimmed.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&trimmed[..at], c.to_ascii_uppercase()),
        _ => (trimmed, 'B'),
    };
    let shift = match unit {
        'B' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        _ => return Err(format!("unknown unit {unit:?} (use K, M or G)")),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count"))?;
    value
        .checked_mul(1 << shift)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("256M"), Ok(256 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("-5").unwrap_err().contains("not a byte count"));
        assert!(parse_bytes("12X").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("M").is_err());
        assert!(parse_bytes("99999999999999999999G").is_err());
    }
}

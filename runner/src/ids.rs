//! Task ids (ULIDs) and timestamps (RFC 3339 UTC).

use std::time::{SystemTime, UNIX_EPOCH};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A new ULID: 48 bits of milliseconds since the epoch, then 80 random bits, in Crockford
/// base 32 (26 characters, sortable by creation time).
pub(crate) fn ulid() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut random = [0u8; 10];
    if crate::sys::getrandom(&mut random).is_err() {
        // getrandom only fails before the kernel's pool is initialised; mix in the clock and
        // pid so ids stay unique within this process even then.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mixed = nanos ^ ((crate::sys::getpid() as u128) << 64);
        random.copy_from_slice(&mixed.to_le_bytes()[..10]);
    }
    let mut value: u128 = (millis & 0xFFFF_FFFF_FFFF) << 80;
    for (i, b) in random.iter().enumerate() {
        value |= (*b as u128) << (8 * (9 - i));
    }
    let mut out = [0u8; 26];
    for (i, slot) in out.iter_mut().enumerate() {
        let shift = 5 * (25 - i);
        *slot = CROCKFORD[((value >> shift) & 0x1F) as usize];
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Now, as RFC 3339 UTC with milliseconds.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Parses an RFC 3339 timestamp back into a `SystemTime`.
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(s).ok()
}

/// Is `id` a valid session id (`[A-Za-z0-9_-]{1,64}`)? This is also what keeps session ids
/// from naming paths outside the state directory.
pub(crate) fn is_valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Is `id` shaped like a ULID? Task ids name directories, so anything else is refused early.
pub(crate) fn is_valid_task_id(id: &str) -> bool {
    id.len() == 26
        && id
            .bytes()
            .all(|b| CROCKFORD.contains(&b.to_ascii_uppercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_are_unique_sortable_and_valid() {
        let a = ulid();
        let b = ulid();
        assert_ne!(a, b);
        assert!(is_valid_task_id(&a), "{a}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = ulid();
        assert!(c > a, "{c} should sort after {a}");
    }

    #[test]
    fn session_ids_refuse_paths() {
        assert!(is_valid_session_id("abc_DEF-123"));
        for bad in ["", "../etc", "a/b", ".", "..", "a b", &"x".repeat(65)] {
            assert!(!is_valid_session_id(bad), "{bad:?} should be refused");
        }
    }

    #[test]
    fn timestamps_round_trip() {
        let s = now_rfc3339();
        assert!(s.ends_with('Z'), "{s}");
        assert!(parse_rfc3339(&s).is_some());
    }
}

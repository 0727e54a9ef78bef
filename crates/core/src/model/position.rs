//! Fractional position keys (the `fractional_index` crate, hex-encoded so that string
//! order is key order). A list's order is `(position, task id)`: two tasks inserted at the
//! same place concurrently get the same key and are ordered by id.

use fractional_index::FractionalIndex;

fn parse(key: Option<&str>) -> Option<FractionalIndex> {
    key.and_then(|k| FractionalIndex::from_string(k).ok())
}

/// A key strictly between `lo` and `hi` (either may be absent: an open end). When the
/// two are equal or out of order (a tie left by a concurrent insert, or a key a foreign
/// peer wrote that does not parse), the result follows `lo` and the id tie-break decides.
pub(crate) fn between(lo: Option<&str>, hi: Option<&str>) -> String {
    let lo = parse(lo);
    let hi = parse(hi);
    FractionalIndex::new(lo.as_ref(), hi.as_ref())
        .or_else(|| lo.as_ref().map(FractionalIndex::new_after))
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_as_strings() {
        let a = between(None, None);
        let b = between(Some(&a), None);
        let c = between(Some(&a), Some(&b));
        let z = between(None, Some(&a));
        assert!(z < a && a < c && c < b, "{z} {a} {c} {b}");
        // Many inserts at the same spot stay ordered.
        let mut hi = b.clone();
        for _ in 0..200 {
            let k = between(Some(&a), Some(&hi));
            assert!(a < k && k < hi);
            hi = k;
        }
    }

    #[test]
    fn ties_and_garbage_do_not_panic() {
        let a = between(None, None);
        let k = between(Some(&a), Some(&a));
        assert!(k > a);
        let g = between(Some("not hex"), Some("zz"));
        assert!(!g.is_empty());
    }
}

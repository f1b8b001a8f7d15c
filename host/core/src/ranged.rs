//! Serde helpers that refuse a number outside its range while a configuration file or a
//! graph is read. Settings become counts, byte sizes and deadlines (`n * 8`, `mb << 20`,
//! `now + ms`); an absurd value would panic there, or in a release build wrap around and
//! silently lift the limit. Refused while reading, the error says where it was written
//! (the key and line the parser reports).
//!
//! Use: `#[serde(deserialize_with = "heddle_core::ranged::int::<_, u32, 1, 65_536>")]`,
//! or [`opt_int`] on an `Option` field (with `#[serde(default)]`).

use serde::de::{Deserialize, Deserializer, Error, Unexpected};

/// An integer from `MIN` to `MAX` (inclusive), as `T`.
pub fn int<'de, D, T, const MIN: u64, const MAX: u64>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    check::<D::Error, T, MIN, MAX>(u64::deserialize(d)?)
}

/// Like [`int`], for an optional setting: absent (or null) stays `None`.
pub fn opt_int<'de, D, T, const MIN: u64, const MAX: u64>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    Option::<u64>::deserialize(d)?
        .map(check::<D::Error, T, MIN, MAX>)
        .transpose()
}

fn check<E: Error, T: TryFrom<u64>, const MIN: u64, const MAX: u64>(v: u64) -> Result<T, E> {
    let wanted = || format!("a whole number from {MIN} to {MAX}");
    if !(MIN..=MAX).contains(&v) {
        return Err(E::invalid_value(
            Unexpected::Unsigned(v),
            &wanted().as_str(),
        ));
    }
    T::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &wanted().as_str()))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct S {
        #[serde(deserialize_with = "super::int::<_, u32, 1, 100>")]
        n: u32,
        #[serde(default, deserialize_with = "super::opt_int::<_, u64, 1, 10>")]
        o: Option<u64>,
    }

    fn parse(text: &str) -> Result<S, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn values_in_range_pass_and_others_name_the_range() {
        let s = parse(r#"{"n": 100, "o": 10}"#).unwrap();
        assert_eq!((s.n, s.o), (100, Some(10)));
        assert_eq!(parse(r#"{"n": 1}"#).unwrap().o, None);
        assert_eq!(parse(r#"{"n": 1, "o": null}"#).unwrap().o, None);
        let e = parse(r#"{"n": 1000000000}"#).unwrap_err();
        assert!(
            e.contains("1000000000") && e.contains("from 1 to 100"),
            "{e}"
        );
        assert!(parse(r#"{"n": 0}"#).is_err());
        assert!(parse(r#"{"n": -1}"#).is_err());
        assert!(parse(r#"{"n": 5, "o": 11}"#).is_err());
    }
}

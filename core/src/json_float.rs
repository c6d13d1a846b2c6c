//! JSON for the graph's floats: finite values as numbers, `inf`, `-inf` and `nan` as those strings
//! (plain JSON has no non-finite numbers, and a recipe may use `inf`; the `.rlxc` artifact relies on
//! the graph surviving a round trip exactly).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Number(f64),
    Name(String),
}

fn repr(value: f64) -> Repr {
    if value.is_finite() {
        Repr::Number(value)
    } else if value.is_nan() {
        Repr::Name("nan".into())
    } else if value > 0.0 {
        Repr::Name("inf".into())
    } else {
        Repr::Name("-inf".into())
    }
}

fn value<E: serde::de::Error>(repr: Repr) -> Result<f64, E> {
    match repr {
        Repr::Number(x) => Ok(x),
        Repr::Name(name) => match name.as_str() {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            other => Err(E::custom(format!(
                "expected a number, \"inf\", \"-inf\" or \"nan\", found \"{other}\""
            ))),
        },
    }
}

pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    repr(*x).serialize(s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    value(Repr::deserialize(d)?)
}

pub mod option {
    use super::*;

    pub fn serialize<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        x.map(repr).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Option::<Repr>::deserialize(d)?.map(value).transpose()
    }
}

pub mod pairs {
    use super::*;

    pub fn serialize<S: Serializer>(x: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(&String, Repr)> = x.iter().map(|(n, v)| (n, repr(*v))).collect();
        pairs.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, f64)>, D::Error> {
        Vec::<(String, Repr)>::deserialize(d)?
            .into_iter()
            .map(|(n, r)| Ok((n, value(r)?)))
            .collect()
    }
}

//! Client create options: the named, typed values a PJRT plugin takes when its client is made
//! (`preallocate`, `memory_fraction`, `allocator`, `visible_devices` on the CUDA plugin), as
//! EXLA's client options and JAX's `XLA_PYTHON_CLIENT_*` variables set them.
//!
//! PJRT names five types (`PJRT_NamedValue_Type`); a plugin refuses an option of the wrong type
//! or a name it does not know when the client is created, so the type is part of the option.

use std::fmt;

/// The value of one create option, in one of PJRT's five types.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    Str(String),
    Int(i64),
    IntList(Vec<i64>),
    Float(f32),
    Bool(bool),
}

impl OptionValue {
    /// The type's name as written after `KEY:` on the command line.
    pub fn type_name(&self) -> &'static str {
        match self {
            OptionValue::Str(_) => "string",
            OptionValue::Int(_) => "int",
            OptionValue::IntList(_) => "ints",
            OptionValue::Float(_) => "float",
            OptionValue::Bool(_) => "bool",
        }
    }
}

impl fmt::Display for OptionValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionValue::Str(s) => write!(f, "{s:?}"),
            OptionValue::Int(i) => write!(f, "{i}"),
            OptionValue::IntList(l) => {
                let items: Vec<String> = l.iter().map(i64::to_string).collect();
                write!(f, "[{}]", items.join(","))
            }
            OptionValue::Float(x) => write!(f, "{x}"),
            OptionValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One create option: a name the plugin knows and its typed value.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateOption {
    pub name: String,
    pub value: OptionValue,
}

impl CreateOption {
    pub fn new(name: impl Into<String>, value: OptionValue) -> CreateOption {
        CreateOption {
            name: name.into(),
            value,
        }
    }

    /// Parses `KEY=VALUE` or `KEY:TYPE=VALUE`, TYPE one of `bool`, `int`, `ints`, `float`,
    /// `string`. Without a type the value's own form decides: `true`/`false` a bool, an integer
    /// an int, integers separated by commas an int list, a number with a point or exponent a
    /// float, anything else a string. A one-element int list needs `:ints` (`visible_devices:ints=1`).
    pub fn parse(arg: &str) -> Result<CreateOption, String> {
        let (key, raw) = arg
            .split_once('=')
            .ok_or_else(|| format!("{arg:?} is not KEY=VALUE"))?;
        let (name, explicit) = match key.split_once(':') {
            Some((name, ty)) => (name, Some(ty)),
            None => (key, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "{name:?} is not an option name (letters, digits and _)"
            ));
        }
        let value = match explicit {
            Some(ty) => typed(ty, raw).map_err(|e| format!("option {name}: {e}"))?,
            None => inferred(raw),
        };
        Ok(CreateOption::new(name, value))
    }
}

impl fmt::Display for CreateOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

fn typed(ty: &str, raw: &str) -> Result<OptionValue, String> {
    match ty {
        "string" | "str" => Ok(OptionValue::Str(raw.to_string())),
        "bool" => parse_bool(raw)
            .map(OptionValue::Bool)
            .ok_or_else(|| format!("{raw:?} is not a bool (true or false)")),
        "int" => raw
            .parse()
            .map(OptionValue::Int)
            .map_err(|_| format!("{raw:?} is not an integer")),
        "ints" => parse_ints(raw)
            .map(OptionValue::IntList)
            .ok_or_else(|| format!("{raw:?} is not a list of integers separated by commas")),
        "float" => parse_float(raw)
            .map(OptionValue::Float)
            .ok_or_else(|| format!("{raw:?} is not a number")),
        other => Err(format!(
            "unknown type {other:?} (bool, int, ints, float or string)"
        )),
    }
}

fn inferred(raw: &str) -> OptionValue {
    if let Some(b) = parse_bool(raw) {
        OptionValue::Bool(b)
    } else if let Ok(i) = raw.parse() {
        OptionValue::Int(i)
    } else if let Some(list) = raw.contains(',').then(|| parse_ints(raw)).flatten() {
        OptionValue::IntList(list)
    } else if let Some(x) = parse_float(raw) {
        OptionValue::Float(x)
    } else {
        OptionValue::Str(raw.to_string())
    }
}

fn parse_bool(raw: &str) -> Option<bool> {
    match raw {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// Integers separated by commas; the empty string is the empty list.
pub fn parse_ints(raw: &str) -> Option<Vec<i64>> {
    if raw.trim().is_empty() {
        return Some(Vec::new());
    }
    raw.split(',').map(|s| s.trim().parse().ok()).collect()
}

fn parse_float(raw: &str) -> Option<f32> {
    raw.parse::<f32>().ok().filter(|x| x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(arg: &str) -> OptionValue {
        CreateOption::parse(arg).unwrap().value
    }

    #[test]
    fn infers_each_type_from_the_value() {
        assert_eq!(value("preallocate=false"), OptionValue::Bool(false));
        assert_eq!(value("n=3"), OptionValue::Int(3));
        assert_eq!(
            value("visible_devices=0,2"),
            OptionValue::IntList(vec![0, 2])
        );
        assert_eq!(value("memory_fraction=0.5"), OptionValue::Float(0.5));
        assert_eq!(
            value("allocator=cuda_async"),
            OptionValue::Str("cuda_async".into())
        );
        assert_eq!(value("empty="), OptionValue::Str(String::new()));
    }

    #[test]
    fn an_explicit_type_wins() {
        assert_eq!(
            value("visible_devices:ints=1"),
            OptionValue::IntList(vec![1])
        );
        assert_eq!(value("visible_devices:ints="), OptionValue::IntList(vec![]));
        assert_eq!(value("name:string=true"), OptionValue::Str("true".into()));
        assert_eq!(value("f:float=1"), OptionValue::Float(1.0));
        assert_eq!(value("b:bool=true"), OptionValue::Bool(true));
        assert_eq!(value("i:int=-7"), OptionValue::Int(-7));
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let err = |arg: &str| CreateOption::parse(arg).unwrap_err();
        assert!(err("preallocate").contains("is not KEY=VALUE"));
        assert!(err("=1").contains("is not an option name"));
        assert!(err("a b=1").contains("is not an option name"));
        assert!(err("x:bool=yes").contains("option x: \"yes\" is not a bool"));
        assert!(err("x:int=1.5").contains("is not an integer"));
        assert!(err("x:ints=1,a").contains("is not a list of integers"));
        assert!(err("x:float=inf").contains("is not a number"));
        assert!(err("x:uint=1").contains("unknown type \"uint\""));
    }

    #[test]
    fn displays_as_given() {
        let o = CreateOption::parse("visible_devices=0,2").unwrap();
        assert_eq!(o.to_string(), "visible_devices=[0,2]");
        assert_eq!(o.value.type_name(), "ints");
    }
}

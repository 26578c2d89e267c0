//! Client nodes as tenants: the operator's rules (`--tenant`, `--tenant-config`), what each client
//! node gets by them (its weight among the nodes whose runs wait, its device memory quota, its
//! bound on queued runs), and what the node counts for each client node (`:info`'s `tenants`,
//! `/metrics`' `xla_node_tenant_*` families).
//!
//! A tenant is a client node: a run, a transfer or a buffer is the tenant's whose process asked
//! for it. Each client node is a tenant of its own; a rule's pattern names the nodes it applies
//! to, each of which gets the rule's settings for itself (`web*@*:weight=3` gives every `web`
//! node the weight 3, not the `web` nodes together). The first rule whose pattern matches a node
//! applies to it, in the order given (`--tenant-config`'s entries, then the `--tenant` flags);
//! what that rule leaves unset, and every setting of a node no rule names, comes from the
//! `default` rule, else from the built-in defaults (weight 1, no quota, no bound on queued
//! runs).

use crate::byte_count::parse_bytes;
use crate::metrics::Histogram;
use crate::node::consult::{self, Literal};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The largest weight a rule may give.
pub const MAX_WEIGHT: u32 = 1000;

/// The keys a rule may set.
const KEYS: &str = "weight, max_device_bytes, max_queued";

/// A run's priority among the queued runs of its own client node (`priority:` run option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// Highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    pub fn parse(name: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// Which client nodes a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePattern {
    /// `default`: supplies what the other rules leave unset, and applies to the nodes none names.
    Default,
    /// A glob over node names: `*` any characters, `?` one. With an `@` it is matched against
    /// the whole name (`web1@host`), without against the part before the `@` on any host.
    Glob { text: String, whole_name: bool },
}

impl NodePattern {
    pub fn parse(text: &str) -> Result<NodePattern, String> {
        if text == "default" {
            return Ok(NodePattern::Default);
        }
        if text.is_empty() {
            return Err(
                "the node pattern is empty (write a node name, a glob such as \
                        web*@*, or default)"
                    .into(),
            );
        }
        if let Some(c) = text
            .chars()
            .find(|c| !(c.is_alphanumeric() || "_-.@*?".contains(*c)))
        {
            return Err(format!(
                "the node pattern {text:?} holds {c:?}: a node name's letters, digits, _ - . @, \
                 and the wildcards * and ? only"
            ));
        }
        if text.matches('@').count() > 1 {
            return Err(format!(
                "the node pattern {text:?} holds more than one @ (a node name is name@host)"
            ));
        }
        Ok(NodePattern::Glob {
            text: text.to_string(),
            whole_name: text.contains('@'),
        })
    }

    /// Whether the rule names `node` (`name@host`); `default` names none by itself.
    pub fn matches(&self, node: &str) -> bool {
        match self {
            NodePattern::Default => false,
            NodePattern::Glob { text, whole_name } => {
                let subject = match whole_name {
                    true => node,
                    false => node.split('@').next().unwrap_or(node),
                };
                glob(text.as_bytes(), subject.as_bytes())
            }
        }
    }
}

impl std::fmt::Display for NodePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodePattern::Default => f.write_str("default"),
            NodePattern::Glob { text, .. } => f.write_str(text),
        }
    }
}

/// `*` matches any run of bytes, `?` one byte, anything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was, and the text position it is tried from.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// A bound; `None`: `infinity`.
type Bound<T> = Option<T>;

/// What one rule sets; `None`: left unset (a bound set to `infinity` is `Some(None)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantKeys {
    pub weight: Option<u32>,
    pub max_device_bytes: Option<Bound<u64>>,
    pub max_queued: Option<Bound<usize>>,
}

impl TenantKeys {
    /// Sets `key` from `value` (a flag's text or a file's term); a key given twice in one rule
    /// is an error.
    fn set(&mut self, key: &str, value: Value<'_>) -> Result<(), String> {
        let twice = |set: bool| match set {
            true => Err(format!("{key} is given twice")),
            false => Ok(()),
        };
        match key {
            "weight" => {
                twice(self.weight.is_some())?;
                self.weight = Some(value.weight()?);
            }
            "max_device_bytes" => {
                twice(self.max_device_bytes.is_some())?;
                self.max_device_bytes = Some(value.bytes_or_infinity()?.map(|n| n as u64));
            }
            "max_queued" => {
                twice(self.max_queued.is_some())?;
                self.max_queued = Some(value.count_or_infinity()?);
            }
            other => return Err(format!("unknown key {other:?} (known: {KEYS})")),
        }
        Ok(())
    }

    /// These keys, with those `later` sets in their place.
    fn overridden_by(&self, later: &TenantKeys) -> TenantKeys {
        TenantKeys {
            weight: later.weight.or(self.weight),
            max_device_bytes: later.max_device_bytes.or(self.max_device_bytes),
            max_queued: later.max_queued.or(self.max_queued),
        }
    }
}

/// A setting's value as a flag writes it (text) or an option file does (a term).
#[derive(Clone, Copy)]
enum Value<'a> {
    Text(&'a str),
    Term(&'a Literal),
}

impl Value<'_> {
    fn describe(&self) -> String {
        match self {
            Value::Text(t) => format!("{t:?}"),
            Value::Term(t) => t.to_string(),
        }
    }

    fn integer(&self) -> Option<i128> {
        match self {
            Value::Text(t) => t.trim().parse().ok(),
            Value::Term(Literal::Int(n)) => Some(*n),
            Value::Term(_) => None,
        }
    }

    fn is_infinity(&self) -> bool {
        match self {
            Value::Text(t) => t.trim() == "infinity",
            Value::Term(t) => t.as_atom() == Some("infinity"),
        }
    }

    fn weight(&self) -> Result<u32, String> {
        self.integer()
            .filter(|n| (1..=MAX_WEIGHT as i128).contains(n))
            .map(|n| n as u32)
            .ok_or_else(|| {
                format!(
                    "weight must be an integer from 1 to {MAX_WEIGHT}, got {}",
                    self.describe()
                )
            })
    }

    fn bytes_or_infinity(&self) -> Result<Option<usize>, String> {
        if self.is_infinity() {
            return Ok(None);
        }
        let wrong = |why: String| {
            format!(
                "max_device_bytes must be a positive byte count (suffixes K, M, G) or infinity, \
                 got {}: {why}",
                self.describe()
            )
        };
        match self {
            Value::Text(t) => parse_bytes(t).map(Some).map_err(wrong),
            Value::Term(Literal::Int(n)) => usize::try_from(*n)
                .ok()
                .filter(|&n| n > 0)
                .map(Some)
                .ok_or_else(|| wrong("not positive".into())),
            Value::Term(t) => match t.as_text() {
                Some(text) => parse_bytes(&text).map(Some).map_err(wrong),
                None => Err(wrong("not a number or a string".into())),
            },
        }
    }

    fn count_or_infinity(&self) -> Result<Option<usize>, String> {
        if self.is_infinity() {
            return Ok(None);
        }
        self.integer()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "max_queued must be a non-negative integer or infinity, got {}",
                    self.describe()
                )
            })
    }
}

/// One rule: a pattern and what it sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRule {
    pub pattern: NodePattern,
    pub keys: TenantKeys,
}

impl TenantRule {
    /// A `--tenant` flag's value: `NODE_PATTERN:key=value[,key=value...]`.
    pub fn parse_flag(text: &str) -> Result<TenantRule, String> {
        let (pattern, settings) = text.rsplit_once(':').ok_or_else(|| {
            format!(
                "{text:?} is not NODE_PATTERN:key=value[,key=value...] (keys: {KEYS}), e.g. \
                 web*@*:weight=3,max_device_bytes=8G"
            )
        })?;
        let pattern = NodePattern::parse(pattern)?;
        let mut keys = TenantKeys::default();
        for setting in settings.split(',') {
            let (key, value) = setting.split_once('=').ok_or_else(|| {
                format!("{setting:?} in {text:?} is not key=value (keys: {KEYS})")
            })?;
            keys.set(key.trim(), Value::Text(value))?;
        }
        Ok(TenantRule { pattern, keys })
    }

    /// One entry of a `--tenant-config` file: `{Pattern, [{key, value}, ...]}`.
    fn from_term(term: &Literal) -> Result<TenantRule, String> {
        let Literal::Tuple(parts) = term else {
            return Err(format!("{term} is not {{Pattern, [{{key, value}}, ...]}}"));
        };
        let [pattern, settings] = &parts[..] else {
            return Err(format!("{term} is not {{Pattern, [{{key, value}}, ...]}}"));
        };
        let pattern = match pattern {
            Literal::Atom(a) => a.clone(),
            other => other
                .as_text()
                .ok_or_else(|| format!("the pattern {other} is not a string or an atom"))?,
        };
        let pattern = NodePattern::parse(&pattern)?;
        let settings = settings
            .as_list()
            .ok_or_else(|| format!("the settings of {pattern} are not a list: {settings}"))?;
        let mut keys = TenantKeys::default();
        for setting in &settings {
            match setting {
                Literal::Tuple(kv) if kv.len() == 2 && kv[0].as_atom().is_some() => {
                    let key = kv[0].as_atom().expect("checked");
                    keys.set(key, Value::Term(&kv[1]))
                        .map_err(|e| format!("{pattern}: {e}"))?;
                }
                other => {
                    return Err(format!(
                        "{pattern}: {other} is not {{key, value}} (keys: {KEYS})"
                    ))
                }
            }
        }
        Ok(TenantRule { pattern, keys })
    }
}

/// The operator's rules, in the order they apply; `default` among them names no node itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantRules {
    rules: Vec<TenantRule>,
}

impl TenantRules {
    /// The rules of `config` (a `--tenant-config` file), then those of the `--tenant` flags. A
    /// flag for a pattern given before (in the file or an earlier flag) sets the keys it names in
    /// that rule, which keeps its place: the command line overrides the file, the last flag the
    /// earlier ones. A pattern twice in the file is an error.
    pub fn build(config: Option<&Path>, flags: &[TenantRule]) -> Result<TenantRules, String> {
        let mut rules = TenantRules::default();
        if let Some(path) = config {
            let file = |e: String| format!("--tenant-config {}: {e}", path.display());
            for rule in read_config(path).map_err(file)? {
                if rules.find(&rule.pattern).is_some() {
                    return Err(file(format!("{} is given twice", rule.pattern)));
                }
                rules.rules.push(rule);
            }
        }
        for rule in flags {
            match rules.rules.iter_mut().find(|r| r.pattern == rule.pattern) {
                Some(given) => given.keys = given.keys.overridden_by(&rule.keys),
                None => rules.rules.push(rule.clone()),
            }
        }
        Ok(rules)
    }

    fn find(&self, pattern: &NodePattern) -> Option<&TenantRule> {
        self.rules.iter().find(|r| r.pattern == *pattern)
    }

    /// What `node` gets.
    pub fn settings_for(&self, node: &str) -> TenantSettings {
        let default = self
            .find(&NodePattern::Default)
            .map(|r| r.keys.clone())
            .unwrap_or_default();
        let rule = self.rules.iter().find(|r| r.pattern.matches(node));
        let keys = match rule {
            Some(rule) => default.overridden_by(&rule.keys),
            None => default,
        };
        TenantSettings {
            rule: rule.map_or(NodePattern::Default, |r| r.pattern.clone()),
            weight: keys.weight.unwrap_or(1),
            max_device_bytes: keys.max_device_bytes.flatten(),
            max_queued: keys.max_queued.flatten(),
        }
    }
}

/// The entries of a `--tenant-config` file: one term, a list of `{Pattern, Settings}`.
fn read_config(path: &Path) -> Result<Vec<TenantRule>, String> {
    let term = consult::read(path)?;
    let entries = term.as_list().ok_or_else(|| {
        format!(
            "the file holds {term}, not a list of {{Pattern, [{{key, value}}, ...]}} (e.g. \
             [{{\"web*@*\", [{{weight, 3}}]}}].)"
        )
    })?;
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| TenantRule::from_term(entry).map_err(|e| format!("entry {}: {e}", i + 1)))
        .collect()
}

/// What one client node gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    /// The rule that named it (`default` when none did).
    pub rule: NodePattern,
    pub weight: u32,
    /// Device bytes its buffers and work in flight may take together (`None`: no quota).
    pub max_device_bytes: Option<u64>,
    /// Runs it may have waiting for a place (`None`: no bound).
    pub max_queued: Option<usize>,
}

/// Why a request of a client node was turned away, as `:info` and `/metrics` count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// More runs queued than its `max_queued` (`:overloaded`).
    Overloaded,
    /// Over its `max_device_bytes` (`:quota`).
    Quota,
    /// Over the node's `--max-device-bytes` (`:resource_exhausted`).
    ResourceExhausted,
    /// No place within the run's `queue_timeout` (`:timeout`).
    Timeout,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::Overloaded,
        Refusal::Quota,
        Refusal::ResourceExhausted,
        Refusal::Timeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Overloaded => "overloaded",
            Refusal::Quota => "quota",
            Refusal::ResourceExhausted => "resource_exhausted",
            Refusal::Timeout => "timeout",
        }
    }
}

/// One client node: its settings and its figures.
#[derive(Debug)]
pub struct Tenant {
    /// Its node name (`name@host`).
    pub node: Arc<str>,
    pub settings: TenantSettings,
    /// Runs waiting for a place now (the scheduler keeps it).
    pub queued: AtomicUsize,
    /// Runs admitted and not yet done now (the scheduler keeps it).
    pub running: AtomicUsize,
    /// Runs answered, whatever the outcome.
    runs: AtomicU64,
    refusals: [AtomicU64; Refusal::ALL.len()],
    /// From a run's arrival to its start on an executor thread.
    pub queue_wait: Histogram,
}

impl Tenant {
    fn new(node: &str, settings: TenantSettings) -> Tenant {
        Tenant {
            node: Arc::from(node),
            settings,
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            runs: AtomicU64::new(0),
            refusals: Default::default(),
            queue_wait: Histogram::default(),
        }
    }

    /// A run of this node was answered.
    pub fn answered(&self) {
        self.runs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused(&self, why: Refusal) {
        self.refusals[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Runs answered.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// (reason, count) for every reason.
    pub fn refusals(&self) -> [(Refusal, u64); Refusal::ALL.len()] {
        Refusal::ALL.map(|r| (r, self.refusals[r as usize].load(Ordering::Relaxed)))
    }
}

/// The client nodes seen so far, each with the settings the rules give it (resolved once, when
/// the node is first seen).
#[derive(Debug, Default)]
pub struct Tenants {
    rules: TenantRules,
    known: Mutex<HashMap<Arc<str>, Arc<Tenant>>>,
}

impl Tenants {
    pub fn new(rules: TenantRules) -> Tenants {
        Tenants {
            rules,
            known: Mutex::default(),
        }
    }

    /// The tenant of client node `node`.
    pub fn get(&self, node: &str) -> Arc<Tenant> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tenant) = known.get(node) {
            return tenant.clone();
        }
        let tenant = Arc::new(Tenant::new(node, self.rules.settings_for(node)));
        known.insert(tenant.node.clone(), tenant.clone());
        tenant
    }

    /// Every client node seen so far, by name.
    pub fn all(&self) -> Vec<Arc<Tenant>> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = known.values().cloned().collect();
        all.sort_by(|a, b| a.node.cmp(&b.node));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_node_names() {
        let p = |t: &str| NodePattern::parse(t).unwrap();
        assert!(p("web*@*").matches("web1@gpu-box"));
        assert!(!p("web*@*").matches("etl@gpu-box"));
        assert!(p("web?").matches("web1@any"));
        assert!(!p("web?").matches("web12@any"));
        assert!(p("etl").matches("etl@h1") && p("etl").matches("etl@h2"));
        assert!(!p("etl").matches("etl2@h1"));
        assert!(p("*").matches("anything@at.all"));
        assert!(p("*@h1").matches("a@h1") && !p("*@h1").matches("a@h2"));
        assert!(p("a*b*c@*").matches("axxbyyc@h"));
        assert!(!p("a*b*c@*").matches("axxbyy@h"));
        assert!(!NodePattern::Default.matches("default@h"));
    }

    #[test]
    fn patterns_are_checked() {
        assert!(NodePattern::parse("").unwrap_err().contains("empty"));
        assert!(NodePattern::parse("a b").unwrap_err().contains("' '"));
        assert!(NodePattern::parse("a@b@c")
            .unwrap_err()
            .contains("more than one @"));
        assert_eq!(NodePattern::parse("default").unwrap(), NodePattern::Default);
    }

    #[test]
    fn flags_are_parsed_and_checked() {
        let rule =
            TenantRule::parse_flag("web*@*:weight=3,max_device_bytes=8G,max_queued=500").unwrap();
        assert_eq!(rule.pattern.to_string(), "web*@*");
        assert_eq!(rule.keys.weight, Some(3));
        assert_eq!(rule.keys.max_device_bytes, Some(Some(8 << 30)));
        assert_eq!(rule.keys.max_queued, Some(Some(500)));
        let unlimited = TenantRule::parse_flag("default:max_queued=infinity").unwrap();
        assert_eq!(unlimited.keys.max_queued, Some(None));
        let error = |text: &str| TenantRule::parse_flag(text).unwrap_err();
        assert!(error("web").contains("is not NODE_PATTERN:key=value"));
        assert!(error("web:weight").contains("is not key=value"));
        assert!(error("web:colour=red").contains("unknown key \"colour\""));
        assert!(error("web:weight=0").contains("from 1 to 1000"));
        assert!(error("web:weight=1001").contains("from 1 to 1000"));
        assert!(error("web:weight=x").contains("from 1 to 1000"));
        assert!(error("web:max_device_bytes=-5").contains("positive byte count"));
        assert!(error("web:max_device_bytes=0").contains("positive byte count"));
        assert!(error("web:max_queued=-1").contains("non-negative integer"));
        assert!(error("web:weight=2,weight=3").contains("weight is given twice"));
        assert!(error(":weight=2").contains("empty"));
    }

    #[test]
    fn the_first_matching_rule_applies_and_default_fills_in() {
        let flags: Vec<_> = [
            "web*@*:weight=3",
            "web1@*:weight=5",
            "default:max_queued=100,max_device_bytes=1M",
            "etl:max_device_bytes=infinity",
        ]
        .iter()
        .map(|f| TenantRule::parse_flag(f).unwrap())
        .collect();
        let rules = TenantRules::build(None, &flags).unwrap();
        let web1 = rules.settings_for("web1@h");
        assert_eq!(web1.weight, 3, "the first matching rule wins");
        assert_eq!(web1.rule.to_string(), "web*@*");
        assert_eq!(web1.max_queued, Some(100));
        assert_eq!(web1.max_device_bytes, Some(1 << 20));
        let etl = rules.settings_for("etl@h");
        assert_eq!((etl.weight, etl.max_device_bytes), (1, None));
        let other = rules.settings_for("other@h");
        assert_eq!(other.rule, NodePattern::Default);
        assert_eq!(other.max_queued, Some(100));
        let none = TenantRules::default().settings_for("a@h");
        assert_eq!(
            (none.weight, none.max_device_bytes, none.max_queued),
            (1, None, None)
        );
    }

    #[test]
    fn a_config_file_is_read_and_flags_override_it() {
        let dir = std::env::temp_dir().join(format!("xla_node_tenants_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tenants.config");
        std::fs::write(
            &path,
            "%% three applications\n\
             [{\"web*@*\", [{weight, 3}, {max_device_bytes, \"8G\"}]},\n\
              {'etl@*', [{weight, 1}, {max_queued, 200}]},\n\
              {default, [{max_device_bytes, 4294967296}, {max_queued, infinity}]}].\n",
        )
        .unwrap();
        let flags = vec![TenantRule::parse_flag("etl@*:weight=2").unwrap()];
        let rules = TenantRules::build(Some(&path), &flags).unwrap();
        let web = rules.settings_for("web7@h");
        assert_eq!((web.weight, web.max_device_bytes), (3, Some(8 << 30)));
        let etl = rules.settings_for("etl@h");
        assert_eq!((etl.weight, etl.max_queued), (2, Some(200)));
        assert_eq!(etl.max_device_bytes, Some(4 << 30));

        std::fs::write(&path, "[{\"web\", [{weight, -1}]}].").unwrap();
        let bad = TenantRules::build(Some(&path), &[]).unwrap_err();
        assert!(bad.contains("entry 1: web: weight must be"), "{bad}");
        std::fs::write(&path, "[{\"web\", [{speed, 1}]}].").unwrap();
        let bad = TenantRules::build(Some(&path), &[]).unwrap_err();
        assert!(bad.contains("unknown key \"speed\""), "{bad}");
        std::fs::write(&path, "[{web, [{weight, 1}]}, {web, [{weight, 2}]}].").unwrap();
        let bad = TenantRules::build(Some(&path), &[]).unwrap_err();
        assert!(bad.contains("web is given twice"), "{bad}");
        std::fs::write(&path, "{web, 1}.").unwrap();
        let bad = TenantRules::build(Some(&path), &[]).unwrap_err();
        assert!(bad.contains("not a list"), "{bad}");
        let missing = TenantRules::build(Some(&dir.join("absent")), &[]).unwrap_err();
        assert!(missing.starts_with("--tenant-config "), "{missing}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn tenants_are_resolved_once_and_listed_by_name() {
        let flags = vec![TenantRule::parse_flag("b*:weight=2").unwrap()];
        let tenants = Tenants::new(TenantRules::build(None, &flags).unwrap());
        let b = tenants.get("b1@h");
        assert!(Arc::ptr_eq(&b, &tenants.get("b1@h")));
        assert_eq!(b.settings.weight, 2);
        tenants.get("a@h").refused(Refusal::Quota);
        let all = tenants.all();
        assert_eq!(
            all.iter().map(|t| &*t.node).collect::<Vec<_>>(),
            ["a@h", "b1@h"]
        );
        assert_eq!(
            all[0].refusals()[Refusal::Quota as usize],
            (Refusal::Quota, 1)
        );
    }
}

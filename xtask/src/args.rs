//! A tiny `--flag value` parser for the tasks.

/// Parsed flags: `--name value` pairs and bare `--switch`es.
pub struct Args {
    pairs: Vec<(String, Option<String>)>,
}

impl Args {
    /// Parses `argv`; `switches` are flags that take no value.
    pub fn parse(argv: &[String], switches: &[&str]) -> Result<Self, String> {
        let mut pairs = Vec::new();
        let mut it = argv.iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument `{a}`"));
            };
            if switches.contains(&name) {
                pairs.push((name.to_string(), None));
            } else {
                let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
                pairs.push((name.to_string(), Some(v.clone())));
            }
        }
        Ok(Args { pairs })
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    /// True when the switch `--name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, _)| n == name)
    }

    /// `--name` parsed as a number, or `default`.
    pub fn num(&self, name: &str, default: usize) -> Result<usize, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{name}: `{v}` is not a number")),
        }
    }

    /// Errors on flags outside `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.pairs.iter().find(|(n, _)| !known.contains(&n.as_str())) {
            Some((n, _)) => Err(format!("unknown flag --{n}")),
            None => Ok(()),
        }
    }
}

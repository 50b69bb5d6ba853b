//! The few statistics every benchmark report uses: median with min–max over repeats, and a
//! goal judged on a ratio.

/// (median, min, max) of the figures that are numbers; all NaN when none is.
pub fn mmm(v: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `median (min–max)` with `digits` decimals.
pub fn fig(v: (f64, f64, f64), digits: usize) -> String {
    format!("{:.d$} ({:.d$}–{:.d$})", v.0, v.1, v.2, d = digits)
}

/// A ratio goal: `at_least` (the figure must reach the bound) or at most.
#[derive(Debug, Clone, Copy)]
pub struct Goal {
    pub bound: f64,
    pub at_least: bool,
}

impl Goal {
    pub fn at_least(bound: f64) -> Goal {
        Goal {
            bound,
            at_least: true,
        }
    }

    pub fn at_most(bound: f64) -> Goal {
        Goal {
            bound,
            at_least: false,
        }
    }

    /// "≥ 0.70: met" — judged on the median.
    pub fn verdict(&self, median: f64) -> String {
        let met = if self.at_least {
            median >= self.bound
        } else {
            median <= self.bound
        };
        let op = if self.at_least { "≥" } else { "≤" };
        let word = if median.is_nan() {
            "not measured"
        } else if met {
            "**met**"
        } else {
            "**not met**"
        };
        format!("{op} {:.2}: {word}", self.bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_skip_nan_and_goals_judge_the_median() {
        assert_eq!(mmm([3.0, f64::NAN, 1.0, 2.0].into_iter()), (2.0, 1.0, 3.0));
        assert!(mmm(std::iter::empty()).0.is_nan());
        assert_eq!(Goal::at_least(0.7).verdict(0.71), "≥ 0.70: **met**");
        assert_eq!(Goal::at_most(2.0).verdict(2.5), "≤ 2.00: **not met**");
        assert_eq!(
            Goal::at_least(2.0).verdict(f64::NAN),
            "≥ 2.00: not measured"
        );
    }
}

//! The cost ceiling, enforced by reservation. Checking spent cost before a call is not
//! enough: the next call's cost is only known afterwards, so $0.49 spent could admit a
//! $0.30 call. Each model turn first reserves its worst case (every input token at the
//! input price, the full output limit at the output price) and is admitted only if
//! spent + reserved stays within the cap; the actual cost replaces the reservation after.

use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "supervisor cost cap ${cap:.4} reached: ${spent:.4} spent, ${reserved:.4} reserved, next turn may cost up to ${estimate:.4}"
)]
pub struct BudgetError {
    pub cap: f64,
    pub spent: f64,
    pub reserved: f64,
    pub estimate: f64,
}

#[derive(Debug)]
pub struct CostBudget {
    cap: f64,
    state: Mutex<(f64, f64)>, // (spent, reserved)
}

/// An admitted turn's worst case, to be committed with the actual cost.
#[derive(Debug)]
#[must_use = "commit the reservation with the actual cost"]
pub struct Reservation {
    amount: f64,
}

impl Reservation {
    pub fn amount(&self) -> f64 {
        self.amount
    }
}

impl CostBudget {
    pub fn new(cap: f64) -> Self {
        CostBudget {
            cap,
            state: Mutex::new((0.0, 0.0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (f64, f64)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn reserve(&self, estimate: f64) -> Result<Reservation, BudgetError> {
        let mut s = self.lock();
        if s.0 + s.1 + estimate > self.cap {
            return Err(BudgetError {
                cap: self.cap,
                spent: s.0,
                reserved: s.1,
                estimate,
            });
        }
        s.1 += estimate;
        Ok(Reservation { amount: estimate })
    }

    /// Replaces the reservation with the actual cost (which may exceed it only if the
    /// provider ignored the output limit; it is recorded either way).
    pub fn commit(&self, r: Reservation, actual: f64) {
        let mut s = self.lock();
        s.1 = (s.1 - r.amount).max(0.0);
        s.0 += actual.max(0.0);
    }

    pub fn spent(&self) -> f64 {
        self.lock().0
    }

    pub fn cap(&self) -> f64 {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_admits_only_within_cap() {
        let b = CostBudget::new(0.50);
        let r = b.reserve(0.30).unwrap();
        // 0.30 reserved: another 0.30 would overshoot even though nothing is spent yet.
        assert!(b.reserve(0.30).is_err());
        b.commit(r, 0.01);
        assert!((b.spent() - 0.01).abs() < 1e-12);
        let r2 = b.reserve(0.49).unwrap();
        b.commit(r2, 0.49);
        let e = b.reserve(0.001).unwrap_err();
        assert!(e.to_string().contains("cost cap"), "{e}");
    }
}

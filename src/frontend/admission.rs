//! Admission: the connection caps, in total and per analyst, held for a connection's life.

use super::*;

/// Counts the authenticated connections of each analyst.
#[derive(Debug)]
pub(super) struct Admission {
    pub(super) per_analyst_max: usize,
    open: std::sync::Mutex<HashMap<String, usize>>,
}

/// One analyst's place among their connections; given back when the connection ends (the slot
/// lives in the connection's session extensions).
pub(super) struct AnalystSlot {
    admission: Arc<Admission>,
    analyst: String,
}

impl Admission {
    pub(super) fn new(per_analyst_max: usize) -> Admission {
        Admission {
            per_analyst_max,
            open: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// A slot for `analyst`, or `None` if they already hold `per_analyst_max` connections.
    pub(super) fn admit(self: &Arc<Self>, analyst: &str) -> Option<AnalystSlot> {
        // A poisoned map is still a consistent map: every update is a single statement.
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(analyst.to_string()).or_insert(0);
        if *count >= self.per_analyst_max {
            return None;
        }
        *count += 1;
        Some(AnalystSlot {
            admission: self.clone(),
            analyst: analyst.to_string(),
        })
    }
}

impl Drop for AnalystSlot {
    fn drop(&mut self) {
        let mut open = self
            .admission
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.analyst) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.analyst);
            }
        }
    }
}

//! An account's hosting status, as the network reports it (`#account` events, `getRepoStatus`).

/// An account's hosting status, as the firehose reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountState {
    Active,
    Deactivated,
    Suspended,
    Takendown,
    Deleted,
    /// Any other status (`desynchronized`, `throttled`, ...): recorded, not hidden.
    Other,
}

impl AccountState {
    pub const ALL: [AccountState; 6] = [
        AccountState::Active,
        AccountState::Deactivated,
        AccountState::Suspended,
        AccountState::Takendown,
        AccountState::Deleted,
        AccountState::Other,
    ];

    /// The state of an atproto account `status` string; unknown statuses are `Other`.
    pub fn parse(status: &str) -> Self {
        Self::ALL.into_iter().find(|state| state.as_str() == status).unwrap_or(AccountState::Other)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            AccountState::Active => "active",
            AccountState::Deactivated => "deactivated",
            AccountState::Suspended => "suspended",
            AccountState::Takendown => "takendown",
            AccountState::Deleted => "deleted",
            AccountState::Other => "other",
        }
    }

    /// Whether queries hide the account's links while it is in this state (they are not deleted:
    /// reactivation shows them again).
    pub const fn is_hidden(self) -> bool {
        matches!(self, AccountState::Deactivated | AccountState::Suspended | AccountState::Takendown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_state_strings() {
        for state in AccountState::ALL {
            assert_eq!(AccountState::parse(state.as_str()), state);
        }
        assert_eq!(AccountState::parse("desynchronized"), AccountState::Other);
        assert_eq!(AccountState::parse("Suspended"), AccountState::Other);
        let hidden: Vec<_> = AccountState::ALL.into_iter().filter(|s| s.is_hidden()).collect();
        assert_eq!(hidden, [AccountState::Deactivated, AccountState::Suspended, AccountState::Takendown]);
    }
}

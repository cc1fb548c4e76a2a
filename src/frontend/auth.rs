//! Authentication: SCRAM-SHA-256 against the policy's verifiers, with a decoy for unknown
//! analysts so both failures look alike, and the ParameterStatus sent at startup.

use super::*;

/// Analyst credentials from the policy, in the form SCRAM needs.
pub(super) struct Credentials {
    database: String,
    secrets: HashMap<String, StoredSecret>,
    decoy_key: [u8; 32],
}

pub(super) enum StoredSecret {
    Verifier {
        salt: Vec<u8>,
        iterations: usize,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    },
    Salted {
        salt: Vec<u8>,
        salted_password: Vec<u8>,
    },
}

impl Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("analysts", &self.secrets.len())
            .finish()
    }
}

impl Credentials {
    pub(super) fn new(policy: &Policy) -> Credentials {
        let mut decoy_key = [0u8; 32];
        rand::fill(&mut decoy_key);
        Credentials::with_decoy_key(policy, decoy_key)
    }

    /// The credentials of a reloaded policy, with the same decoy verifiers for unknown users
    /// (a reload must not change what a login as a non-analyst looks like).
    fn following(&self, policy: &Policy) -> Credentials {
        Credentials::with_decoy_key(policy, self.decoy_key)
    }

    fn with_decoy_key(policy: &Policy, decoy_key: [u8; 32]) -> Credentials {
        let secrets = policy
            .analysts
            .values()
            .map(|a| {
                let secret = match &a.credential {
                    Credential::Verifier {
                        salt,
                        iterations,
                        stored_key,
                        server_key,
                    } => StoredSecret::Verifier {
                        salt: salt.clone(),
                        iterations: *iterations,
                        stored_key: stored_key.clone(),
                        server_key: server_key.clone(),
                    },
                    Credential::Password(pw) => {
                        let mut salt = vec![0u8; 16];
                        rand::fill(salt.as_mut_slice());
                        let salted_password = gen_salted_password(pw, &salt, 4096);
                        StoredSecret::Salted {
                            salt,
                            salted_password,
                        }
                    }
                };
                (a.name.clone(), secret)
            })
            .collect();
        Credentials {
            database: policy.database.clone(),
            secrets,
            decoy_key,
        }
    }

    /// A verifier for an unknown user: deterministic per user (so retries look alike) and never
    /// matching any password.
    fn decoy(&self, user: &str) -> ScramSecret {
        let digest = |label: &[u8]| {
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
            ctx.update(&self.decoy_key);
            ctx.update(label);
            ctx.update(user.as_bytes());
            ctx.finish().as_ref().to_vec()
        };
        ScramSecret::Verifier {
            salt: digest(b"salt")[..16].to_vec(),
            iterations: 4096,
            stored_key: digest(b"stored"),
            server_key: digest(b"server"),
        }
    }
}

#[async_trait]
impl AuthSource for Credentials {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        Err(PgWireError::InvalidPassword(
            login.user().unwrap_or_default().to_owned(),
        ))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let user = login.user().unwrap_or_default();
        let database = login.database().unwrap_or(user);
        if database != self.database {
            // FATAL, as PostgreSQL refuses a startup packet for a database it does not have.
            return Err(super::fatal_user_error(&Error::UnknownDatabase {
                name: database.to_string(),
                hint: format!(
                    "This server serves the database \"{}\"; connect to it (e.g. psql -d {}).",
                    self.database, self.database
                ),
            }));
        }
        let secret = match self.secrets.get(user) {
            Some(StoredSecret::Verifier {
                salt,
                iterations,
                stored_key,
                server_key,
            }) => ScramSecret::Verifier {
                salt: salt.clone(),
                iterations: *iterations,
                stored_key: stored_key.clone(),
                server_key: server_key.clone(),
            },
            Some(StoredSecret::Salted {
                salt,
                salted_password,
            }) => ScramSecret::SaltedPassword {
                salt: salt.clone(),
                salted_password: salted_password.clone(),
            },
            None => self.decoy(user),
        };
        Ok((secret, None))
    }
}

/// The credentials of the policy in force: rebuilt once per reload, on the first login after
/// it, so a login always checks the analysts of the current policy.
pub(super) struct LiveCredentials {
    live: Arc<Live>,
    /// The credentials and the generation of the policy they were built from.
    current: std::sync::Mutex<(u64, Arc<Credentials>)>,
}

impl Debug for LiveCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveCredentials").finish_non_exhaustive()
    }
}

impl LiveCredentials {
    pub(super) fn new(live: Arc<Live>) -> LiveCredentials {
        let shared = live.current();
        let credentials = Arc::new(Credentials::new(&shared.policy));
        LiveCredentials {
            live,
            current: std::sync::Mutex::new((shared.generation, credentials)),
        }
    }

    fn credentials(&self) -> Arc<Credentials> {
        let shared = self.live.current();
        // Every update is one assignment of a complete pair: a poisoned lock is consistent.
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.0 != shared.generation {
            *current = (
                shared.generation,
                Arc::new(current.1.following(&shared.policy)),
            );
        }
        current.1.clone()
    }
}

#[async_trait]
impl AuthSource for LiveCredentials {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        self.credentials().get_password(login).await
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        self.credentials().get_scram_secret(login).await
    }
}

/// ParameterStatus values sent at startup.
pub(super) struct Parameters {
    pub(super) live: Arc<Live>,
}

impl ServerParameterProvider for Parameters {
    fn server_parameters<C>(&self, client: &C) -> Option<HashMap<String, String>>
    where
        C: ClientInfo,
    {
        let version = self
            .live
            .current()
            .upstream
            .cached_server_version()
            .unwrap_or_else(|| "15.0".into());
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let application = client
            .metadata()
            .get("application_name")
            .cloned()
            .unwrap_or_default();
        let mut p = HashMap::new();
        for (k, v) in [
            ("server_version", version.as_str()),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("IntervalStyle", "postgres"),
            ("TimeZone", "UTC"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("is_superuser", "off"),
            ("default_transaction_read_only", "on"),
            ("in_hot_standby", "off"),
            ("session_authorization", user.as_str()),
            ("application_name", application.as_str()),
        ] {
            p.insert(k.to_string(), v.to_string());
        }
        Some(p)
    }
}

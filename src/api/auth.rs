//! Session tokens: `v1.<user_id>.<expires_unix_s>.<hex HMAC-SHA256 of the first three>`.
//!
//! The acting user of every request comes from its token, never from the path or body: a
//! path's `userId` must equal it (else 403), so no endpoint lets a user write for another.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Signs and checks tokens with one key.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

/// Why a token was refused (the API answers 401 with this).
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Malformed,
    BadSignature,
    Expired,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Malformed => "the session token is malformed",
            Refused::BadSignature => "the session token's signature does not match",
            Refused::Expired => "the session token has expired",
        })
    }
}

impl Signer {
    pub fn new(key: &[u8]) -> Self {
        Self { key: key.to_vec() }
    }

    /// The signer of `api.session_key`, refused when the key is too short to be a secret.
    pub fn from_session_key(key: &str) -> crate::error::Result<Self> {
        if key.len() < 32 {
            return Err(crate::error::Error::Config(
                "api.session_key must be at least 32 bytes (set LIKES__API__SESSION_KEY)".into(),
            ));
        }
        Ok(Self::new(key.as_bytes()))
    }

    fn mac(&self, payload: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(payload.as_bytes());
        mac
    }

    /// A token for `user` valid until `expires_s` (Unix seconds).
    pub fn sign(&self, user: &str, expires_s: i64) -> String {
        let payload = format!("v1.{user}.{expires_s}");
        let sig = hex::encode(self.mac(&payload).finalize().into_bytes());
        format!("{payload}.{sig}")
    }

    /// The user of a valid token at `now_s`.
    pub fn verify(&self, token: &str, now_s: i64) -> Result<String, Refused> {
        let (payload, sig) = token.rsplit_once('.').ok_or(Refused::Malformed)?;
        let mut parts = payload.split('.');
        let (Some("v1"), Some(user), Some(expires), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refused::Malformed);
        };
        let expires: i64 = expires.parse().map_err(|_| Refused::Malformed)?;
        let sig = hex::decode(sig).map_err(|_| Refused::Malformed)?;
        // verify_slice compares in constant time.
        self.mac(payload)
            .verify_slice(&sig)
            .map_err(|_| Refused::BadSignature)?;
        if !super::valid_id(user) {
            return Err(Refused::Malformed);
        }
        if expires < now_s {
            return Err(Refused::Expired);
        }
        Ok(user.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_tampering() {
        let s = Signer::new(b"0123456789abcdef0123456789abcdef");
        let t = s.sign("u42", 2_000);
        assert_eq!(s.verify(&t, 1_000), Ok("u42".into()));
        assert_eq!(s.verify(&t, 2_001), Err(Refused::Expired));
        let forged = t.replace("u42", "u43");
        assert_eq!(s.verify(&forged, 1_000), Err(Refused::BadSignature));
        let other = Signer::new(b"another key, same length........");
        assert_eq!(other.verify(&t, 1_000), Err(Refused::BadSignature));
        assert_eq!(s.verify("garbage", 1_000), Err(Refused::Malformed));
        assert_eq!(s.verify("v1.u.1.zz", 1_000), Err(Refused::Malformed));
    }
}

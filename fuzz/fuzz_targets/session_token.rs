//! Session tokens: any bearer string verifies or is refused, never panics; only a token this
//! key signed verifies, for the user it was signed for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let signer = likes::api::auth::Signer::new(b"fuzz-session-key-of-32-bytes-----");
    if let Ok(token) = std::str::from_utf8(data) {
        let _ = signer.verify(token, 1_700_000_000);
        // A user id made of the input, signed, verifies as that user.
        if likes::write::valid_id(token) {
            let t = signer.sign(token, 1_700_000_100);
            assert_eq!(
                signer.verify(&t, 1_700_000_000).ok().as_deref(),
                Some(token)
            );
        }
    }
});

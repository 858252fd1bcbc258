//! The signature checks behind `jsonwebtoken`: a verify-only [`CryptoProvider`] on `ring` (already
//! the server's crypto), for the four algorithms `auth.oauth.algorithms` may name. It signs nothing
//! and knows no HMAC: a token whose header says HS256 fails here even if every other check were
//! bypassed, and `none` cannot be parsed at all.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::jwk::ThumbprintHash;
use jsonwebtoken::signature::{self, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::signature as ring_sig;

/// The provider; [`install`] makes it the process default.
static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: no_signer,
    verifier_factory: verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(ErrorKind::InvalidAlgorithm.into()),
        rsa_pub_components_from_public_key: |_| Err(ErrorKind::InvalidAlgorithm.into()),
        ec_pub_components_from_private_key: |_, _| Err(ErrorKind::InvalidAlgorithm.into()),
        ed_pub_components_from_private_key: |_, _| Err(ErrorKind::InvalidAlgorithm.into()),
        compute_digest,
    },
};

/// Makes this provider `jsonwebtoken`'s (once per process; later calls change nothing).
pub fn install() {
    // An error only says a provider is installed already, which can only be this one: nothing else
    // in the process installs one.
    let _ = PROVIDER.install_default();
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>, Error> {
    Err(ErrorKind::InvalidAlgorithm.into())
}

fn compute_digest(data: &[u8], hash: ThumbprintHash) -> Result<Vec<u8>, Error> {
    let algorithm = match hash {
        ThumbprintHash::SHA256 => &ring::digest::SHA256,
        ThumbprintHash::SHA384 => &ring::digest::SHA384,
        ThumbprintHash::SHA512 => &ring::digest::SHA512,
        _ => return Err(ErrorKind::InvalidAlgorithm.into()),
    };
    Ok(ring::digest::digest(algorithm, data).as_ref().to_vec())
}

/// A verifier for `algorithm` with `key`, when both are of one family and the algorithm is one of
/// the four.
fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    let (params, family): (&'static dyn ring_sig::VerificationAlgorithm, _) = match algorithm {
        Algorithm::RS256 => (&ring_sig::RSA_PKCS1_2048_8192_SHA256, AlgorithmFamily::Rsa),
        Algorithm::PS256 => (&ring_sig::RSA_PSS_2048_8192_SHA256, AlgorithmFamily::Rsa),
        Algorithm::ES256 => (&ring_sig::ECDSA_P256_SHA256_FIXED, AlgorithmFamily::Ec),
        Algorithm::EdDSA => (&ring_sig::ED25519, AlgorithmFamily::Ed),
        _ => return Err(ErrorKind::InvalidAlgorithm.into()),
    };
    if key.family() != family {
        return Err(ErrorKind::InvalidKeyFormat.into());
    }
    let rsa = match algorithm {
        Algorithm::RS256 => Some(&ring_sig::RSA_PKCS1_2048_8192_SHA256),
        Algorithm::PS256 => Some(&ring_sig::RSA_PSS_2048_8192_SHA256),
        _ => None,
    };
    Ok(Box::new(RingVerifier {
        algorithm: *algorithm,
        params,
        rsa,
        key: key.clone(),
    }))
}

struct RingVerifier {
    algorithm: Algorithm,
    params: &'static dyn ring_sig::VerificationAlgorithm,
    /// The RSA parameters, for keys given as modulus and exponent.
    rsa: Option<&'static ring_sig::RsaParameters>,
    key: DecodingKey,
}

impl Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, message: &[u8], sig: &Vec<u8>) -> Result<(), signature::Error> {
        let checked = match (self.key.kind(), self.rsa) {
            (DecodingKeyKind::RsaModulusExponent { n, e }, Some(rsa)) => {
                ring_sig::RsaPublicKeyComponents { n, e }.verify(rsa, message, sig)
            }
            (DecodingKeyKind::RsaModulusExponent { .. }, None) => {
                return Err(signature::Error::new());
            }
            (DecodingKeyKind::SecretOrDer(bytes), _) => {
                ring_sig::UnparsedPublicKey::new(self.params, bytes).verify(message, sig)
            }
        };
        checked.map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

// Package pgauth computes Postgres's stored password verifiers, so that
// pgwake can set a role's password without the password itself appearing
// in a statement (where log_statement, pg_stat_statements or an error
// message would keep it).
package pgauth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/xdg-go/scram"
)

// SCRAMIterations is Postgres's default scram_iterations.
const SCRAMIterations = 4096

// SCRAMVerifier returns the SCRAM-SHA-256 verifier Postgres stores for
// password (pg_authid.rolpassword), with a fresh random salt: what
// ALTER ROLE ... PASSWORD 'verifier' takes as it is.
func SCRAMVerifier(password string) (string, error) {
	salt := make([]byte, 16) // Postgres's SCRAM_DEFAULT_SALT_LEN
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	return scramVerifier(password, salt, SCRAMIterations)
}

func scramVerifier(password string, salt []byte, iters int) (string, error) {
	// Postgres SASLpreps the password where it can, as the library does.
	c, err := scram.HashGeneratorFcn(sha256.New).NewClient("", password, "")
	if err != nil {
		return "", fmt.Errorf("scram verifier: %w", err)
	}
	cred, err := c.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: iters})
	if err != nil {
		return "", fmt.Errorf("scram verifier: %w", err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iters, b64(salt), b64(cred.StoredKey), b64(cred.ServerKey)), nil
}

// SetPasswordSQL is the statement that gives role password, as its SCRAM
// verifier: ALTER ROLE takes no parameters, and the verifier is base64
// and '$', safe between quotes.
func SetPasswordSQL(role, password string) (string, error) {
	verifier, err := SCRAMVerifier(password)
	if err != nil {
		return "", err
	}
	return "ALTER ROLE " + pgx.Identifier{role}.Sanitize() + " PASSWORD '" + verifier + "'", nil
}

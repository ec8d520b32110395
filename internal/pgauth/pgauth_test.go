package pgauth

import (
	"encoding/base64"
	"strings"
	"testing"
)

// A verifier Postgres 15 stored for ALTER ROLE postgres PASSWORD
// 'a3f9c2e1b7d4' (select rolpassword from pg_authid): the same password
// and salt give the same keys.
const pg15Verifier = "SCRAM-SHA-256$4096:RPSmo2P+0XxETTBipAwNPg==$GBCkRxHI5HyY6CSbj8Jd+26yHD8FD6HovA9511T0m4U=:DEW8frXVaZ1K85EDjw1G258V2GSGSS/AT9j+166LfdM="

func TestSCRAMVerifierMatchesPostgres(t *testing.T) {
	salt, err := base64.StdEncoding.DecodeString("RPSmo2P+0XxETTBipAwNPg==")
	if err != nil {
		t.Fatal(err)
	}
	got, err := scramVerifier("a3f9c2e1b7d4", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if got != pg15Verifier {
		t.Errorf("verifier\n %s\nwant Postgres's\n %s", got, pg15Verifier)
	}
	if other, _ := scramVerifier("a3f9c2e1b7d5", salt, 4096); other == pg15Verifier {
		t.Error("another password gave the same verifier")
	}
}

func TestSCRAMVerifierSaltsEachTime(t *testing.T) {
	a, err := SCRAMVerifier("pw")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SCRAMVerifier("pw")
	if a == b || !strings.HasPrefix(a, "SCRAM-SHA-256$4096:") {
		t.Errorf("verifiers %q and %q: want two salts, 4096 iterations", a, b)
	}
}

package proxy

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestRelayStartupLearnsKeys feeds relayStartup a server's startup replies
// as bytes (protocol 3.0 and 3.2 key lengths) and checks that everything
// reaches the client unchanged and the key is learned.
func TestRelayStartupLearnsKeys(t *testing.T) {
	t.Parallel()
	for _, keyLen := range []int{4, 32, 256} {
		secret := bytes.Repeat([]byte{0xab}, keyLen)
		var stream []byte
		for _, m := range []pgproto3.BackendMessage{
			&pgproto3.AuthenticationOk{},
			&pgproto3.ParameterStatus{Name: "server_version", Value: "18"},
			&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: secret},
			&pgproto3.ReadyForQuery{TxStatus: 'I'},
			&pgproto3.CommandComplete{CommandTag: []byte("AFTER")}, // must stay unread
		} {
			var err error
			if stream, err = m.Encode(stream); err != nil {
				t.Fatal(err)
			}
		}
		first, rest := stream[:5], bytes.NewReader(stream[5:])
		var client bytes.Buffer
		n, key, err := relayStartup(&client, rest, first)
		if err != nil {
			t.Fatalf("key %d: %v", keyLen, err)
		}
		want := append([]byte{0, 0, 0x10, 0x92}, secret...) // pid 4242
		if !bytes.Equal(key, want) {
			t.Fatalf("key %d: learned %x, want %x", keyLen, key, want)
		}
		after, _ := (&pgproto3.CommandComplete{CommandTag: []byte("AFTER")}).Encode(nil)
		if got := client.Bytes(); !bytes.Equal(got, stream[:len(stream)-len(after)]) || n != int64(len(got)) {
			t.Fatalf("key %d: client got %d bytes (n=%d), want the %d startup bytes", keyLen, len(got), n, len(stream)-len(after))
		}
		if rest.Len() != len(after) {
			t.Fatalf("key %d: relay read past ReadyForQuery (%d bytes left, want %d)", keyLen, rest.Len(), len(after))
		}
	}
}

func TestCancelRegistry(t *testing.T) {
	t.Parallel()
	var r cancelRegistry
	k1, k2 := []byte{0, 0, 0, 1, 9, 9, 9, 9}, []byte{0, 0, 0, 1, 8, 8, 8, 8}
	r.add(k1, "10.0.0.1:5432")
	if addr, ok := r.lookup(k1); !ok || addr != "10.0.0.1:5432" {
		t.Fatalf("lookup k1 = %q %v", addr, ok)
	}
	if _, ok := r.lookup(k2); ok {
		t.Fatal("a key with the same pid but another secret matched")
	}
	r.remove(k1)
	if _, ok := r.lookup(k1); ok {
		t.Fatal("key still known after the session ended")
	}
}

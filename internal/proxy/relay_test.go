package proxy

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestRelayStartupReissuesKeys feeds relayStartup a server's startup
// replies as bytes (protocol 3.0 and 3.2 key lengths) and checks that the
// server's key is handed over, the client gets the key issued in its place
// and everything else unchanged, and nothing past ReadyForQuery is read.
func TestRelayStartupReissuesKeys(t *testing.T) {
	t.Parallel()
	encode := func(secret []byte) []byte {
		var stream []byte
		for _, m := range []pgproto3.BackendMessage{
			&pgproto3.AuthenticationOk{},
			&pgproto3.ParameterStatus{Name: "server_version", Value: "18"},
			&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: secret},
			&pgproto3.ReadyForQuery{TxStatus: 'I'},
		} {
			var err error
			if stream, err = m.Encode(stream); err != nil {
				t.Fatal(err)
			}
		}
		return stream
	}
	for _, keyLen := range []int{4, 32, 256} {
		secret := bytes.Repeat([]byte{0xab}, keyLen)
		issued := bytes.Repeat([]byte{0xcd}, keyLen)
		after, _ := (&pgproto3.CommandComplete{CommandTag: []byte("AFTER")}).Encode(nil) // must stay unread
		stream := append(encode(secret), after...)
		first, rest := stream[:5], bytes.NewReader(stream[5:])
		var client bytes.Buffer
		var got []byte
		n, err := relayStartup(&client, rest, first, func(key []byte) []byte {
			got = append([]byte(nil), key...)
			return append([]byte{0, 0, 0x10, 0x92}, issued...)
		}, nil)
		if err != nil {
			t.Fatalf("key %d: %v", keyLen, err)
		}
		if want := append([]byte{0, 0, 0x10, 0x92}, secret...); !bytes.Equal(got, want) { // pid 4242
			t.Fatalf("key %d: handed %x, want the server's %x", keyLen, got, want)
		}
		if want := encode(issued); !bytes.Equal(client.Bytes(), want) || n != int64(len(want)) {
			t.Fatalf("key %d: client got %x (n=%d), want %x", keyLen, client.Bytes(), n, want)
		}
		if rest.Len() != len(after) {
			t.Fatalf("key %d: relay read past ReadyForQuery (%d bytes left, want %d)", keyLen, rest.Len(), len(after))
		}
	}
}

func TestCancelRegistry(t *testing.T) {
	t.Parallel()
	var r cancelRegistry
	server := []byte{0, 0, 0, 1, 9, 9, 9, 9}
	k1 := r.issue(false, 0, server, "10.0.0.1:5432")
	if len(k1) != len(server) || !bytes.Equal(k1[:4], server[:4]) || bytes.Equal(k1, server) {
		t.Fatalf("issued %x for %x: want the same pid and length, another secret", k1, server)
	}
	if s, ok := r.lookup(k1); !ok || s.addr != "10.0.0.1:5432" || !bytes.Equal(s.key, server) {
		t.Fatalf("lookup = %+v %v", s, ok)
	}
	if _, ok := r.lookup(server); ok {
		t.Fatal("the server's own key is accepted from clients")
	}
	k2 := r.issue(true, 0x2a, server, "10.0.0.2:5432")
	if k2[4] != 0x2a || bytes.Equal(k1, k2) {
		t.Fatalf("issued %x with tag 0x2a", k2)
	}
	r.remove(k1)
	if _, ok := r.lookup(k1); ok {
		t.Fatal("key still known after the session ended")
	}
	if _, ok := r.lookup(k2); !ok {
		t.Fatal("removing one session forgot another")
	}
}

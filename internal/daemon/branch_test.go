package daemon

import (
	"testing"

	"github.com/pgwake/pgwake/internal/backend"
)

func TestKnownSizesTakesTheRecordedAndAsksForTheRest(t *testing.T) {
	recorded := map[string]int64{"seeded": 4 << 20, "gone": 1}
	snaps := []backend.Snapshot{{Label: "seeded"}, {Label: "measured", Bytes: 7}}
	if !knownSizes(snaps, recorded) {
		t.Fatal("every snapshot has a size, yet the runtime would be asked to measure")
	}
	if snaps[0].Bytes != 4<<20 || snaps[1].Bytes != 7 {
		t.Fatalf("sizes %d and %d, want the recorded 4 MiB and the runtime's 7", snaps[0].Bytes, snaps[1].Bytes)
	}
	older := []backend.Snapshot{{Label: "seeded"}, {Label: "before-records"}}
	if knownSizes(older, recorded) {
		t.Fatal("a snapshot with no recorded size counted as known")
	}
	if older[1].Bytes != 0 {
		t.Fatalf("size %d for a snapshot nothing measured", older[1].Bytes)
	}
}

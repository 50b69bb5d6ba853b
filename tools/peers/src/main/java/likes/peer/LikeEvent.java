package likes.peer;

import java.nio.charset.StandardCharsets;

/**
 * The fields of schemas/likes/v1/events.proto's LikeEvent that the topology needs, decoded
 * from the protobuf wire format by hand (no generated code, no protoc): item_id = 1,
 * user_id = 2, op_id = 3, state = 4 (LIKED = 2), event_time_ms = 5. Unknown fields are
 * skipped, as protobuf readers do. Returns null for bytes that are not a valid LikeEvent
 * with an item, a user and an op_id, which the topology dead-letters.
 */
final class LikeEvent {
  final String item;
  final String user;
  final long opId;
  final boolean liked;
  final long eventTimeMs;

  private LikeEvent(String item, String user, long opId, boolean liked, long eventTimeMs) {
    this.item = item;
    this.user = user;
    this.opId = opId;
    this.liked = liked;
    this.eventTimeMs = eventTimeMs;
  }

  static LikeEvent parse(byte[] b) {
    if (b == null) {
      return null;
    }
    String item = null;
    String user = null;
    long opId = 0;
    long state = 0;
    long eventTime = 0;
    int[] pos = {0};
    try {
      while (pos[0] < b.length) {
        long tag = varint(b, pos);
        int field = (int) (tag >>> 3);
        int wire = (int) (tag & 7);
        switch (wire) {
          case 0 -> {
            long v = varint(b, pos);
            if (field == 3) {
              opId = v;
            } else if (field == 4) {
              state = v;
            } else if (field == 5) {
              eventTime = v;
            }
          }
          case 2 -> {
            long len = varint(b, pos);
            if (len < 0 || pos[0] + len > b.length) {
              return null;
            }
            if (field == 1 || field == 2) {
              String s = new String(b, pos[0], (int) len, StandardCharsets.UTF_8);
              if (field == 1) {
                item = s;
              } else {
                user = s;
              }
            }
            pos[0] += (int) len;
          }
          case 1 -> pos[0] += 8;
          case 5 -> pos[0] += 4;
          default -> {
            return null;
          }
        }
      }
    } catch (ArrayIndexOutOfBoundsException e) {
      return null;
    }
    if (pos[0] != b.length || item == null || item.isEmpty() || user == null || user.isEmpty()
        || opId == 0) {
      return null;
    }
    return new LikeEvent(item, user, opId, state == 2, eventTime);
  }

  private static long varint(byte[] b, int[] pos) {
    long v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      byte x = b[pos[0]++];
      v |= (long) (x & 0x7f) << shift;
      if (x >= 0) {
        return v;
      }
    }
    throw new ArrayIndexOutOfBoundsException("varint longer than 10 bytes");
  }
}

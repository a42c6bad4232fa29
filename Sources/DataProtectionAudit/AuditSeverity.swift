/// How much a finding matters: `high` exposes data (plaintext, loose keys), `medium` weakens its
/// protection or gets it backed up where it should not be, `low` is hygiene.
public enum AuditSeverity: String, Codable, Sendable, CaseIterable, Comparable {
    case low, medium, high

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rank < rhs.rank }

    private var rank: Int {
        switch self {
        case .low: 0
        case .medium: 1
        case .high: 2
        }
    }
}

import Foundation

/// One of the four iOS Data Protection classes.
///
/// The raw value is the class number Apple uses (A = 1 … D = 4); it is also the byte stored
/// in keybags and file headers (see `docs/FORMAT.md`).
///
/// | class | Foundation name | available |
/// |---|---|---|
/// | A `.complete` | `FileProtectionType.complete` | only while unlocked (plus the grace period after a lock) |
/// | B `.completeUnlessOpen` | `.completeUnlessOpen` | new files can be written while locked; open handles survive a lock |
/// | C `.completeUntilFirstUserAuthentication` | `.completeUntilFirstUserAuthentication` | from the first unlock on |
/// | D `.noProtection` | `FileProtectionType.none` | always |
///
/// ```swift
/// let cls = try ProtectionClass(FileProtectionType.complete)   // .complete
/// cls.fileProtectionType                                      // FileProtectionType.complete
/// ```
public enum ProtectionClass: UInt8, Sendable, CaseIterable, Comparable, CustomStringConvertible {
    /// Class A: `NSFileProtectionComplete`.
    case complete = 1
    /// Class B: `NSFileProtectionCompleteUnlessOpen`.
    case completeUnlessOpen = 2
    /// Class C: `NSFileProtectionCompleteUntilFirstUserAuthentication` — the iOS default.
    case completeUntilFirstUserAuthentication = 3
    /// Class D: `NSFileProtectionNone` (Foundation's `.none`; named so it never reads as `Optional.none`).
    case noProtection = 4

    /// The class iOS gives third-party files that name none (class C).
    public static let `default`: ProtectionClass = .completeUntilFirstUserAuthentication

    /// The letter Apple's documentation uses: "A", "B", "C" or "D".
    public var letter: String { ["A", "B", "C", "D"][Int(rawValue) - 1] }

    /// The short name — `complete`, `complete-unless-open`, `until-first-unlock`, `none` — that
    /// the directory-default attribute stores (FORMAT.md §3) and command lines accept.
    public var shortName: String {
        switch self {
        case .complete: "complete"
        case .completeUnlessOpen: "complete-unless-open"
        case .completeUntilFirstUserAuthentication: "until-first-unlock"
        case .noProtection: "none"
        }
    }

    /// The name iOS code writes: `complete`, `completeUnlessOpen`,
    /// `completeUntilFirstUserAuthentication`, `none` (`FileProtectionType`'s members).
    public var iOSName: String {
        switch self {
        case .complete: "complete"
        case .completeUnlessOpen: "completeUnlessOpen"
        case .completeUntilFirstUserAuthentication: "completeUntilFirstUserAuthentication"
        case .noProtection: "none"
        }
    }

    /// Parses a short name (see ``shortName``), the name iOS code writes (``iOSName``), a
    /// Foundation raw value (`NSFileProtectionComplete` …) or a class letter.
    public init?(name: String) {
        // In any case: `Complete`, `COMPLETE`, `nsfileprotectioncomplete` (no two spellings of
        // different classes differ only by case).
        let folded = name.lowercased()
        for candidate in ProtectionClass.allCases
        where [candidate.shortName, candidate.iOSName, candidate.fileProtectionType.rawValue, candidate.letter]
            .contains(where: { $0.lowercased() == folded })
        {
            self = candidate
            return
        }
        return nil
    }

    public var description: String { "\(letter) (\(shortName))" }

    /// Strength order: A is strongest, D weakest. `max(a, b)` is the stronger class.
    public static func < (lhs: ProtectionClass, rhs: ProtectionClass) -> Bool {
        lhs.rawValue > rhs.rawValue
    }

    /// The same class as Foundation's `FileProtectionType`.
    public var fileProtectionType: FileProtectionType {
        switch self {
        case .complete: .complete
        case .completeUnlessOpen: .completeUnlessOpen
        case .completeUntilFirstUserAuthentication: .completeUntilFirstUserAuthentication
        case .noProtection: .none
        }
    }

    /// Converts Foundation's `FileProtectionType`. Throws for a type this library does not
    /// implement (such as iOS 17's `completeWhenUserInactive`).
    public init(_ type: FileProtectionType) throws {
        guard let match = ProtectionClass.allCases.first(where: { $0.fileProtectionType.rawValue == type.rawValue })
        else {
            throw KeybagError.unsupportedProtectionType(type.rawValue)
        }
        self = match
    }

    /// The class named by the file-protection bits of `Data.WritingOptions`, or `nil` when the
    /// options name none.
    ///
    /// ```swift
    /// ProtectionClass(writingOptions: [.atomic, .completeFileProtection])   // .complete
    /// ```
    public init?(writingOptions options: Data.WritingOptions) {
        let bits = options.intersection(.fileProtectionMask)
        switch bits {
        case .completeFileProtection: self = .complete
        case .completeFileProtectionUnlessOpen: self = .completeUnlessOpen
        case .completeFileProtectionUntilFirstUserAuthentication: self = .completeUntilFirstUserAuthentication
        case .noFileProtection: self = .noProtection
        default: return nil
        }
    }

    /// The `Data.WritingOptions` bit that names this class.
    public var writingOption: Data.WritingOptions {
        switch self {
        case .complete: .completeFileProtection
        case .completeUnlessOpen: .completeFileProtectionUnlessOpen
        case .completeUntilFirstUserAuthentication: .completeFileProtectionUntilFirstUserAuthentication
        case .noProtection: .noFileProtection
        }
    }
}

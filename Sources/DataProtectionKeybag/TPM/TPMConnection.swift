import CTPMSoftwareStack
import Foundation

/// One connection to a TPM 2.0 through the TPM Software Stack's ESAPI (`Esys_*`, loaded at run
/// time: ``TPMSoftwareStack``), opened for one
/// operation and closed when dropped: ESAPI contexts are not thread-safe, and an unlock is rare.
///
/// A thin layer in swift-system's manner: each method names the ESAPI call it makes and turns
/// its `TSS2_RC` into a ``TPMError``. Every session it starts is *salted* with the storage primary
/// key, so that authorization values and unsealed secrets cross the bus encrypted (as
/// systemd-cryptenroll does).
final class TPMConnection {
    /// The TCTI configuration (`device:/dev/tpmrm0`, `swtpm:path=/run/swtpm.sock` …).
    let tcti: String
    private var tctiContext: OpaquePointer?
    var esys: OpaquePointer?

    /// The stack logs its own warnings to standard error; ours are the typed errors. `TSS2_LOG`
    /// set by the user still wins.
    private static let quietStack: Void = {
        if getenv("TSS2_LOG") == nil { setenv("TSS2_LOG", "all+none", 1) }
    }()

    /// Opens the TPM named by `tcti` (`Tss2_TctiLdr_Initialize`, then `Esys_Initialize`).
    init(tcti: String) throws {
        try TPMSoftwareStack.load()
        Self.quietStack
        self.tcti = tcti
        // The device TCTI opens its path for writing and writes TPM commands into it: only a
        // character device (a TPM) is handed to it, never a file that happens to be named.
        // Every spelling of it counts: `device:`, `tcti-device:`, `libtss2-tcti-device.so.0:` …
        let (name, configuration) =
            tcti.firstIndex(of: ":").map { (String(tcti[..<$0]), String(tcti[tcti.index(after: $0)...])) } ?? (tcti, "")
        if name.lowercased().contains("device"), case let path = configuration.isEmpty ? "/dev/tpm0" : configuration {
            var st = stat()
            guard stat(path, &st) == 0, st.st_mode & S_IFMT == S_IFCHR else {
                throw TPMError(
                    // TSS2_TCTI_RC_BAD_VALUE
                    kind: .unreachable, call: "Tss2_TctiLdr_Initialize(\(tcti))", code: 0x000A_000B,
                    reason: "\(path) is not a character device, so not a TPM; nothing was written to it")
            }
        }
        var tctiContext: OpaquePointer?
        let rc = tcti.withCString { Tss2_TctiLdr_Initialize($0, &tctiContext) }
        guard rc == TSS2_RC_SUCCESS, tctiContext != nil else {
            throw TPMError(kind: .unreachable, call: "Tss2_TctiLdr_Initialize(\(tcti))", code: rc)
        }
        self.tctiContext = tctiContext
        var esys: OpaquePointer?
        let rc2 = Esys_Initialize(&esys, tctiContext, nil)
        guard rc2 == TSS2_RC_SUCCESS else {
            Tss2_TctiLdr_Finalize(&self.tctiContext)
            throw TPMError(kind: .unreachable, call: "Esys_Initialize(\(tcti))", code: rc2)
        }
        self.esys = esys
    }

    deinit {
        if esys != nil { Esys_Finalize(&esys) }
        if tctiContext != nil { Tss2_TctiLdr_Finalize(&tctiContext) }
    }

    // MARK: - Objects

    /// `Esys_CreatePrimary` under the owner hierarchy with the TCG's standard ECC P-256 storage
    /// key template (the "SRK"): the same key every time on the same TPM, another on any other.
    func createStoragePrimary() throws -> ESYS_TR {
        var inPublic = TPM2B_PUBLIC()
        inPublic.publicArea.type = TPM2_ALG_ECC
        inPublic.publicArea.nameAlg = TPM2_ALG_SHA256
        inPublic.publicArea.objectAttributes =
            TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT | TPMA_OBJECT_FIXEDTPM
            | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA
        inPublic.publicArea.parameters.eccDetail.symmetric.algorithm = TPM2_ALG_AES
        inPublic.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 128
        inPublic.publicArea.parameters.eccDetail.symmetric.mode.aes = TPM2_ALG_CFB
        inPublic.publicArea.parameters.eccDetail.scheme.scheme = TPM2_ALG_NULL
        inPublic.publicArea.parameters.eccDetail.curveID = TPM2_ECC_NIST_P256
        inPublic.publicArea.parameters.eccDetail.kdf.scheme = TPM2_ALG_NULL
        var inSensitive = TPM2B_SENSITIVE_CREATE()
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var handle: ESYS_TR = ESYS_TR(ESYS_TR_NONE)
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: OpaquePointer?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var ticket: OpaquePointer?
        try check("Esys_CreatePrimary") {
            Esys_CreatePrimary(
                esys, ESYS_TR(ESYS_TR_RH_OWNER), ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE),
                &inSensitive, &inPublic, &outsideInfo, &creationPCR, &handle, &outPublic, &creationData, &creationHash,
                &ticket)
        }
        Esys_Free(outPublic); Esys_Free(UnsafeMutableRawPointer(creationData)); Esys_Free(creationHash);
        Esys_Free(UnsafeMutableRawPointer(ticket))
        return handle
    }

    /// `Esys_Create` + `Esys_Load` + `Esys_EvictControl`: seals `secret` in a keyed-hash object
    /// under `parent`, kept at the persistent `handle` (no copy of it is left anywhere else).
    ///
    /// - Parameters:
    ///   - authValue: The object's authorization value (empty: none).
    ///   - policy: The object's authorization policy digest; when given, the object is used only
    ///     through that policy (no `userWithAuth`).
    ///   - dictionaryAttackProtected: Whether wrong authorization values count towards the
    ///     TPM's lockout (`noDA` clear).
    func createPersistentSealedObject(
        parent: ESYS_TR, secret: [UInt8], authValue: [UInt8], policy: [UInt8]?,
        dictionaryAttackProtected: Bool, at handle: UInt32
    ) throws {
        var inSensitive = TPM2B_SENSITIVE_CREATE()
        Self.fill(&inSensitive.sensitive.userAuth, authValue)
        Self.fill(&inSensitive.sensitive.data, secret)
        defer { Self.scrub(&inSensitive) }
        var inPublic = TPM2B_PUBLIC()
        inPublic.publicArea.type = TPM2_ALG_KEYEDHASH
        inPublic.publicArea.nameAlg = TPM2_ALG_SHA256
        var attributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT
        if policy == nil { attributes |= TPMA_OBJECT_USERWITHAUTH }
        if !dictionaryAttackProtected { attributes |= TPMA_OBJECT_NODA }
        inPublic.publicArea.objectAttributes = attributes
        if let policy { Self.fill(&inPublic.publicArea.authPolicy, policy) }
        inPublic.publicArea.parameters.keyedHashDetail.scheme.scheme = TPM2_ALG_NULL
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var outPrivate: OpaquePointer?
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: OpaquePointer?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var ticket: OpaquePointer?
        // The sensitive part travels encrypted (the session's `decrypt` attribute).
        let session = try startSession(type: TPM2_SE(TPM2_SE_HMAC), salt: parent, attributes: TPMA_SESSION_DECRYPT)
        defer { flush(session) }
        try check("Esys_Create") {
            Esys_Create(
                esys, parent, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &inSensitive, &inPublic,
                &outsideInfo,
                &creationPCR, &outPrivate, &outPublic, &creationData, &creationHash, &ticket)
        }
        defer {
            Esys_Free(UnsafeMutableRawPointer(outPrivate)); Esys_Free(outPublic);
            Esys_Free(UnsafeMutableRawPointer(creationData))
            Esys_Free(creationHash); Esys_Free(UnsafeMutableRawPointer(ticket))
        }
        var loaded = ESYS_TR(ESYS_TR_NONE)
        try check("Esys_Load") {
            Esys_Load(
                esys, parent, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), outPrivate,
                outPublic, &loaded)
        }
        defer { flush(loaded) }
        var persistent = ESYS_TR(ESYS_TR_NONE)
        try check("Esys_EvictControl") {
            Esys_EvictControl(
                esys, ESYS_TR(ESYS_TR_RH_OWNER), loaded, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE), TPMI_DH_PERSISTENT(handle), &persistent)
        }
        close(persistent)
    }

    /// `Esys_TR_FromTPMPublic` + `Esys_Unseal` through a salted session with the `encrypt`
    /// attribute: a policy session when `pcrs` is given (`Esys_PolicyPCR`, then
    /// `Esys_PolicyAuthValue` when the object has an authorization value), an HMAC session otherwise.
    func unseal(
        persistent handle: UInt32, parent: ESYS_TR, authValue: [UInt8], pcrs: TPMPCRSelection?
    ) throws -> SecretBytes {
        let object = try resource(handle)
        defer { close(object) }
        try setAuth(object, authValue)
        let session: ESYS_TR
        if let pcrs {
            session = try startSession(type: TPM2_SE(TPM2_SE_POLICY), salt: parent, attributes: TPMA_SESSION_ENCRYPT)
            do {
                try applyPolicy(session, pcrs: pcrs, authValue: !authValue.isEmpty)
            } catch {
                flush(session)
                throw error
            }
        } else {
            session = try startSession(type: TPM2_SE(TPM2_SE_HMAC), salt: parent, attributes: TPMA_SESSION_ENCRYPT)
        }
        defer { flush(session) }
        var out: UnsafeMutablePointer<TPM2B_SENSITIVE_DATA>?
        try check("Esys_Unseal") {
            Esys_Unseal(esys, object, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &out)
        }
        guard let out else { throw TPMError(kind: .other, call: "Esys_Unseal", code: 0) }
        defer {
            Self.scrub(&out.pointee)
            Esys_Free(out)
        }
        let count = min(Int(out.pointee.size), MemoryLayout.size(ofValue: out.pointee.buffer))
        return withUnsafeBytes(of: &out.pointee.buffer) {
            SecretBytes(copying: UnsafeRawBufferPointer(rebasing: $0.prefix(count)))
        }
    }

    /// The policy digest an object must carry to be used with ``unseal(persistent:parent:authValue:pcrs:)``
    /// under the PCRs' *current* values: computed by the TPM in a trial session.
    func policyDigest(pcrs: TPMPCRSelection, authValue: Bool) throws -> [UInt8] {
        let session = try startSession(type: TPM2_SE(TPM2_SE_TRIAL), salt: nil, attributes: 0)
        defer { flush(session) }
        try applyPolicy(session, pcrs: pcrs, authValue: authValue)
        var digest: UnsafeMutablePointer<TPM2B_DIGEST>?
        try check("Esys_PolicyGetDigest") {
            Esys_PolicyGetDigest(
                esys, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &digest)
        }
        defer { Esys_Free(digest) }
        guard let digest else { return [] }
        return Self.bytes(of: digest.pointee)
    }

    /// `Esys_EvictControl` on a persistent object: removes it from the TPM. A missing object is
    /// not an error (it is already gone).
    func evict(persistent handle: UInt32) throws {
        let object: ESYS_TR
        do { object = try resource(handle) } catch let error as TPMError where error.kind == .missing { return }
        var out = ESYS_TR(ESYS_TR_NONE)
        try check("Esys_EvictControl") {
            Esys_EvictControl(
                esys, ESYS_TR(ESYS_TR_RH_OWNER), object, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE), TPMI_DH_PERSISTENT(handle), &out)
        }
    }

    // MARK: - Capabilities

    /// `Esys_GetCapability(TPM2_CAP_HANDLES)`: the handles in use from `first` on.
    func handlesInUse(from first: UInt32, count: UInt32 = 256) throws -> Set<UInt32> {
        var more: TPMI_YES_NO = 0
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        try check("Esys_GetCapability(handles)") {
            Esys_GetCapability(
                esys, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), TPM2_CAP(TPM2_CAP_HANDLES),
                first, count, &more, &data)
        }
        defer { Esys_Free(data) }
        guard let data else { return [] }
        let list = data.pointee.data.handles
        return withUnsafeBytes(of: list.handle) { raw in
            Set(raw.bindMemory(to: TPM2_HANDLE.self).prefix(Int(list.count)))
        }
    }

    /// The dictionary-attack state (`Esys_GetCapability(TPM2_CAP_TPM_PROPERTIES)`: `TPM_PT_PERMANENT`'s
    /// `inLockout`, `TPM_PT_LOCKOUT_COUNTER`, `MAX_AUTH_FAIL`, `LOCKOUT_INTERVAL`, `LOCKOUT_RECOVERY`).
    func dictionaryAttackState() throws -> TPMLockoutState {
        // Part 2 §6.13: TPM_PT_VAR (0x200) + 0, 14, 15, 16, 17 (nested macros Swift does not import).
        let permanentProperty: TPM2_PT = 0x200, lockoutCounter: TPM2_PT = 0x20E
        let permanent = try properties(permanentProperty, count: 1)[permanentProperty] ?? 0
        let values = try properties(lockoutCounter, count: 4)
        return TPMLockoutState(
            inLockout: permanent & TPMA_PERMANENT_INLOCKOUT != 0,
            lockoutAuthorizationSet: permanent & TPMA_PERMANENT_LOCKOUTAUTHSET != 0,
            failedTries: values[lockoutCounter] ?? 0,
            maxTries: values[lockoutCounter + 1] ?? 0,
            recoveryInterval: values[lockoutCounter + 2] ?? 0,
            lockoutRecovery: values[lockoutCounter + 3] ?? 0)
    }

    /// `Esys_DictionaryAttackLockReset` with the lockout hierarchy's authorization value.
    func resetDictionaryAttackLockout(lockoutAuth: [UInt8]) throws {
        try setAuth(ESYS_TR(ESYS_TR_RH_LOCKOUT), lockoutAuth)
        try check("Esys_DictionaryAttackLockReset") {
            Esys_DictionaryAttackLockReset(
                esys, ESYS_TR(ESYS_TR_RH_LOCKOUT), ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE))
        }
    }

    private func properties(_ first: TPM2_PT, count: UInt32) throws -> [TPM2_PT: UInt32] {
        var more: TPMI_YES_NO = 0
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        try check("Esys_GetCapability(properties)") {
            Esys_GetCapability(
                esys, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                TPM2_CAP(TPM2_CAP_TPM_PROPERTIES), first, count, &more, &data)
        }
        defer { Esys_Free(data) }
        guard let data else { return [:] }
        let list = data.pointee.data.tpmProperties
        return withUnsafeBytes(of: list.tpmProperty) { raw in
            let tagged = raw.bindMemory(to: TPMS_TAGGED_PROPERTY.self).prefix(Int(list.count))
            return Dictionary(tagged.map { ($0.property, $0.value) }, uniquingKeysWith: { $1 })
        }
    }

    // MARK: - Sessions and resources

    /// `Esys_StartAuthSession` with AES-128-CFB parameter encryption and SHA-256, salted with
    /// `salt` (a storage key) when given.
    func startSession(type: TPM2_SE, salt: ESYS_TR?, attributes: TPMA_SESSION) throws -> ESYS_TR {
        var symmetric = TPMT_SYM_DEF()
        symmetric.algorithm = TPM2_ALG_AES
        symmetric.keyBits.aes = 128
        symmetric.mode.aes = TPM2_ALG_CFB
        var session = ESYS_TR(ESYS_TR_NONE)
        try check("Esys_StartAuthSession") {
            Esys_StartAuthSession(
                esys, salt ?? ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE), nil, type, &symmetric, TPM2_ALG_SHA256, &session)
        }
        let flags = attributes | TPMA_SESSION_CONTINUESESSION
        let rc = Esys_TRSess_SetAttributes(esys, session, flags, 0xFF)
        if rc != TSS2_RC_SUCCESS {
            flush(session)
            throw TPMError(call: "Esys_TRSess_SetAttributes", code: rc)
        }
        return session
    }

    private func applyPolicy(_ session: ESYS_TR, pcrs: TPMPCRSelection, authValue: Bool) throws {
        var selection = pcrs.list
        var digest = TPM2B_DIGEST()
        try check("Esys_PolicyPCR") {
            Esys_PolicyPCR(
                esys, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &digest, &selection)
        }
        if authValue {
            try check("Esys_PolicyAuthValue") {
                Esys_PolicyAuthValue(esys, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE))
            }
        }
    }

    /// `Esys_TR_FromTPMPublic`: the ESAPI resource of a persistent object or NV index.
    func resource(_ handle: UInt32) throws -> ESYS_TR {
        var object = ESYS_TR(ESYS_TR_NONE)
        try check("Esys_TR_FromTPMPublic(0x\(String(handle, radix: 16)))") {
            Esys_TR_FromTPMPublic(
                esys, handle, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &object)
        }
        return object
    }

    func setAuth(_ object: ESYS_TR, _ authValue: [UInt8]) throws {
        var auth = TPM2B_AUTH()
        Self.fill(&auth, authValue)
        defer { Self.scrub(&auth) }
        try check("Esys_TR_SetAuth") { Esys_TR_SetAuth(esys, object, &auth) }
    }

    /// `Esys_FlushContext` of a transient object or session.
    func flush(_ handle: ESYS_TR) {
        _ = Esys_FlushContext(esys, handle)
    }

    /// `Esys_TR_Close`: forgets a resource without touching the TPM — after overwriting the
    /// authorization value ESAPI keeps for it (it frees that memory without zeroing it).
    func close(_ handle: ESYS_TR) {
        var empty = TPM2B_AUTH()
        _ = Esys_TR_SetAuth(esys, handle, &empty)
        var handle = handle
        _ = Esys_TR_Close(esys, &handle)
    }

    func check(_ call: String, _ body: () -> TSS2_RC) throws {
        let rc = body()
        guard rc == TSS2_RC_SUCCESS else { throw TPMError(call: call, code: rc) }
    }

    // MARK: - Sized buffers

    /// Copies `bytes` into a `TPM2B_*`'s buffer and sets its size (callers pass at most the buffer's size).
    static func fill<T>(_ sized: inout T, _ bytes: [UInt8]) {
        withUnsafeMutableBytes(of: &sized) { raw in
            let capacity = raw.count - 2
            let count = min(bytes.count, capacity)
            raw.storeBytes(of: UInt16(count), as: UInt16.self)
            raw.baseAddress!.advanced(by: 2).copyMemory(from: bytes, byteCount: count)
        }
    }

    /// The bytes of a `TPM2B_*`.
    static func bytes<T>(of sized: T) -> [UInt8] {
        withUnsafeBytes(of: sized) { raw in
            let count = min(Int(raw.load(as: UInt16.self)), raw.count - 2)
            return Array(raw[2..<(2 + count)])
        }
    }

    /// Zeroes a structure that held a secret.
    static func scrub<T>(_ value: inout T) {
        withUnsafeMutableBytes(of: &value) { raw in
            if let base = raw.baseAddress { explicit_bzero(base, raw.count) }
        }
    }
}

/// The TPM's dictionary-attack protection, as `TPM2_GetCapability` reports it.
public struct TPMLockoutState: Sendable, Equatable {
    /// The TPM refuses every object subject to dictionary-attack protection until a failure expires.
    public var inLockout: Bool
    /// Whether the TPM's lockout hierarchy has an authorization value. Without one, anyone who can
    /// reach the TPM can reset its failure count (`TPM2_DictionaryAttackLockReset`) or turn the
    /// lockout off, and so guess passcodes online without a limit.
    public var lockoutAuthorizationSet: Bool
    /// Failures counted now (`failedTries`).
    public var failedTries: UInt32
    /// Failures that put the TPM in lockout (`maxTries`).
    public var maxTries: UInt32
    /// Seconds after which one failure is forgotten (`recoveryTime`).
    public var recoveryInterval: UInt32
    /// Seconds before the lockout hierarchy may be tried again after a failure of its own.
    public var lockoutRecovery: UInt32

    /// Failures left before lockout.
    public var remainingTries: UInt32 { maxTries > failedTries ? maxTries - failedTries : 0 }
}

/// A selection of PCRs of the SHA-256 bank, for a policy that binds an object to their values.
public struct TPMPCRSelection: Sendable, Equatable, CustomStringConvertible {
    /// Bit n = PCR n (0…23).
    public var mask: UInt32

    public init(mask: UInt32) { self.mask = mask & 0xFF_FFFF }

    /// Parses `7`, `0,2,7` or `7+14` (systemd-cryptenroll's forms).
    public init?(parsing text: String) {
        var mask: UInt32 = 0
        for part in text.split(whereSeparator: { $0 == "," || $0 == "+" }) {
            guard let n = Int(part.trimmingCharacters(in: .whitespaces)), (0...23).contains(n) else { return nil }
            mask |= 1 << n
        }
        guard mask != 0 else { return nil }
        self.mask = mask
    }

    public var indices: [Int] { (0..<24).filter { mask & (1 << $0) != 0 } }

    public var description: String { indices.map(String.init).joined(separator: "+") }

    var list: TPML_PCR_SELECTION {
        var list = TPML_PCR_SELECTION()
        list.count = 1
        list.pcrSelections.0.hash = TPM2_ALG_SHA256
        list.pcrSelections.0.sizeofSelect = 3
        list.pcrSelections.0.pcrSelect.0 = UInt8(mask & 0xFF)
        list.pcrSelections.0.pcrSelect.1 = UInt8(mask >> 8 & 0xFF)
        list.pcrSelections.0.pcrSelect.2 = UInt8(mask >> 16 & 0xFF)
        return list
    }
}

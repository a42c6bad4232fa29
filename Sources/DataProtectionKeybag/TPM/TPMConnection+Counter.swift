import CTPMSoftwareStack
import Foundation

/// The TPM's monotonic counter (an NV index): the failed-attempt count that a copied-back
/// keybag cannot reset.
extension TPMConnection {
    /// An 8-byte counter index (`TPM_NT_COUNTER`: it can only go up, and a new index starts at
    /// the highest value any counter of this TPM ever had), writable and readable with
    /// `authValue`, incremented once so it can be read.
    func defineCounter(at index: UInt32, authValue: [UInt8]) throws {
        try defineIndex(at: index, type: TPM2_NT(TPM2_NT_COUNTER), authValue: authValue)
        try incrementCounter(at: index, authValue: authValue)
    }

    /// `Esys_NV_Increment`.
    func incrementCounter(at index: UInt32, authValue: [UInt8]) throws {
        let nv = try resource(index)
        defer { close(nv) }
        try setAuth(nv, authValue)
        let session = try startSession(type: TPM2_SE(TPM2_SE_HMAC), salt: nil, attributes: 0)
        defer { flush(session) }
        try check("Esys_NV_Increment") {
            Esys_NV_Increment(esys, nv, nv, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE))
        }
    }

    /// `Esys_NV_Read` of the counter's 8 big-endian bytes.
    func readCounter(at index: UInt32, authValue: [UInt8]) throws -> UInt64 {
        try readNumber(at: index, authValue: authValue)
    }

    /// An ordinary 8-byte index holding a number, written and read with `authValue`, then
    /// written with `value`.
    func defineNumber(at index: UInt32, authValue: [UInt8], value: UInt64) throws {
        try defineIndex(at: index, type: TPM2_NT(TPM2_NT_ORDINARY), authValue: authValue)
        try writeNumber(value, at: index, authValue: authValue)
    }

    /// `Esys_NV_DefineSpace` of an 8-byte index of `type` (`AUTHWRITE`, `AUTHREAD`, `NO_DA`) under
    /// the owner hierarchy, through a salted session that encrypts the new index's `authValue`.
    func defineIndex(at index: UInt32, type: TPM2_NT, authValue: [UInt8]) throws {
        var auth = TPM2B_AUTH()
        Self.fill(&auth, authValue)
        defer { Self.scrub(&auth) }
        var info = TPM2B_NV_PUBLIC()
        info.nvPublic.nvIndex = index
        info.nvPublic.nameAlg = TPM2_ALG_SHA256
        info.nvPublic.attributes =
            (TPMA_NV(type) << TPMA_NV(TPMA_NV_TPM2_NT_SHIFT)) | TPMA_NV_AUTHWRITE | TPMA_NV_AUTHREAD | TPMA_NV_NO_DA
        info.nvPublic.dataSize = 8
        let primary = try createStoragePrimary()
        defer { flush(primary) }
        let session = try startSession(type: TPM2_SE(TPM2_SE_HMAC), salt: primary, attributes: TPMA_SESSION_DECRYPT)
        defer { flush(session) }
        var nv = ESYS_TR(ESYS_TR_NONE)
        try check("Esys_NV_DefineSpace") {
            Esys_NV_DefineSpace(
                esys, ESYS_TR(ESYS_TR_RH_OWNER), session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &auth, &info,
                &nv)
        }
        close(nv)
    }

    /// `Esys_NV_Write` of 8 big-endian bytes.
    func writeNumber(_ value: UInt64, at index: UInt32, authValue: [UInt8]) throws {
        let nv = try resource(index)
        defer { close(nv) }
        try setAuth(nv, authValue)
        let session = try startSession(type: TPM2_SE(TPM2_SE_HMAC), salt: nil, attributes: 0)
        defer { flush(session) }
        var data = TPM2B_MAX_NV_BUFFER()
        Self.fill(&data, (0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * UInt64($0))) })
        try check("Esys_NV_Write") {
            Esys_NV_Write(esys, nv, nv, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &data, 0)
        }
    }

    /// `Esys_NV_Read` of 8 big-endian bytes.
    func readNumber(at index: UInt32, authValue: [UInt8]) throws -> UInt64 {
        let nv = try resource(index)
        defer { close(nv) }
        try setAuth(nv, authValue)
        let session = try startSession(type: TPM2_SE(TPM2_SE_HMAC), salt: nil, attributes: 0)
        defer { flush(session) }
        var data: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
        try check("Esys_NV_Read") {
            Esys_NV_Read(esys, nv, nv, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), 8, 0, &data)
        }
        defer { Esys_Free(data) }
        guard let data else { throw TPMError(kind: .other, call: "Esys_NV_Read", code: 0) }
        let bytes = Self.bytes(of: data.pointee)
        guard bytes.count == 8 else {
            throw TPMError(kind: .other, call: "Esys_NV_Read (\(bytes.count) bytes)", code: 0)
        }
        return bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// `Esys_NV_UndefineSpace` (owner authorization). A missing index is not an error.
    func undefine(index: UInt32) throws {
        let nv: ESYS_TR
        do { nv = try resource(index) } catch let error as TPMError where error.kind == .missing { return }
        try check("Esys_NV_UndefineSpace") {
            Esys_NV_UndefineSpace(
                esys, ESYS_TR(ESYS_TR_RH_OWNER), nv, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE),
                ESYS_TR(ESYS_TR_NONE))
        }
    }
}

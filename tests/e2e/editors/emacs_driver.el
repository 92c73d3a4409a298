;;; emacs_driver.el --- what the batch Emacs drivers share  -*- lexical-binding: t; -*-

;; Loaded by emacs_e2e.el and emacs_defaults_e2e.el with
;;   (load (expand-file-name "emacs_driver.el" (file-name-directory load-file-name)) nil t)
;; The config from $DIFFILL_E2E_CONFIG, the result alist and a clock, finishing (the JSON
;; result written, with eglot's events when the run failed; exit 0 when it completed), and
;; diffill set up against the config's server and connected to the config's file.

;;; Code:

(require 'package)
(package-activate-all)                  ; Debian's elpa-eglot lives in site-lisp/elpa
(require 'eglot)
(require 'json)

(defvar e2e-cfg (json-read-file (getenv "DIFFILL_E2E_CONFIG")))
(defun e2e-get (obj &rest keys)
  (dolist (k keys obj) (setq obj (alist-get k obj))))
(defvar e2e-result nil "Alist written as JSON at the end.")
(defvar e2e-t0 (float-time))
(defun e2e-ms () (round (* 1000 (- (float-time) e2e-t0))))
(defun e2e-put (key value) (setf (alist-get key e2e-result) value))

(defun e2e-finish (ok &optional err)
  (e2e-put 'ok (if ok t :json-false))
  (when err (e2e-put 'error err))
  (e2e-put 'total_ms (e2e-ms))
  (when err (message "e2e error: %s" err))
  (let ((ev (ignore-errors (jsonrpc-events-buffer (eglot-current-server)))))
    (when (and ev (not ok))
      (e2e-put 'events (with-current-buffer ev
                         (buffer-substring-no-properties (max (point-min) (- (point-max) 20000))
                                                         (point-max))))))
  (with-temp-file (e2e-get e2e-cfg 'result)
    (insert (json-encode e2e-result)))
  (kill-emacs (if ok 0 1)))

(defvar e2e-original nil "The document as opened.")

(defun e2e-setup ()
  "Load diffill from the config's plugin_dir; its server command and settings from the config,
eglot connecting synchronously."
  (add-to-list 'load-path (e2e-get e2e-cfg 'plugin_dir))
  (require 'diffill)
  (setq diffill-server-command (append (e2e-get e2e-cfg 'cmd) nil)
        diffill-server-options
        (json-parse-string (json-encode (e2e-get e2e-cfg 'settings))
                           :object-type 'plist :false-object :json-false)
        eglot-sync-connect t
        eglot-connect-timeout 120))

(defun e2e-connect ()
  "`diffill-setup', then open the config's file (kept in `e2e-original') and connect eglot;
fail when no diffill server manages it."
  (diffill-setup)
  (find-file (e2e-get e2e-cfg 'file))
  (setq e2e-original (buffer-substring-no-properties (point-min) (point-max)))
  (apply #'eglot (eglot--guess-contact))
  (unless (diffill--server) (e2e-finish nil "no diffill server")))

;;; emacs_driver.el ends here

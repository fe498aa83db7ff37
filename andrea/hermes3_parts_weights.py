"""Weights of the Hermes-3 part rule (andrea/hermes3_parts.py): two L2-regularised logistic
regressions over hermes3_parts.FEATURES, fitted on andrea/labelled/hermes3_parts_set.txt by
`python -m andrea.hermes3_parts fit`, which rewrites this file. Do not edit by hand."""

FEATURES = (
    'has_system',
    'rp_terms_system',
    'rp_terms_user',
    'rp_setup_user',
    'act_as_user',
    'card_fields',
    'persona_system',
    'persona_named',
    'user_cast_in_system',
    'assistant_system',
    'fiction_words',
    'user_actions',
    'user_first_person_act',
    'user_opens_with_quote',
    'user_title_vocative',
    'user_name_vocative',
    'user_names_persona',
    'user_you_personal',
    'creative_forms',
    'compose_request',
    'continue_request',
    'invent_request',
    'imaginative',
    'creative_system',
    'functional_form',
    'code',
    'analysis',
    'question_open',
    'math',
    'log_user_words',
    'persona_and_engaged',
    'compose_not_functional',
)
ROLEPLAY_WEIGHTS = (
    1.1294839220957986,  # has_system
    -0.6278617285322953,  # rp_terms_system
    2.1357601896944116,  # rp_terms_user
    2.975438432940034,  # rp_setup_user
    0.6546605637748425,  # act_as_user
    0.6470767691327487,  # card_fields
    1.254213662830697,  # persona_system
    0.7888674437118424,  # persona_named
    2.2807974916660547,  # user_cast_in_system
    -0.7619963406698163,  # assistant_system
    0.8566628352041872,  # fiction_words
    3.4200574996662985,  # user_actions
    1.0303515317666778,  # user_first_person_act
    2.2544927380669004,  # user_opens_with_quote
    1.8695134200158134,  # user_title_vocative
    1.5498495219293411,  # user_name_vocative
    1.568381375985045,  # user_names_persona
    1.2948537736883081,  # user_you_personal
    -0.2714201522101985,  # creative_forms
    -0.9393127758720025,  # compose_request
    -1.4180920247941478,  # continue_request
    -1.493299980677361,  # invent_request
    -0.6625413968236621,  # imaginative
    -0.5612323034287607,  # creative_system
    -1.2759236818055748,  # functional_form
    -0.8165575834093979,  # code
    -0.9334589168637928,  # analysis
    -1.2416977932022468,  # question_open
    -1.061190797382395,  # math
    1.1958126103075897,  # log_user_words
    1.651507439614292,  # persona_and_engaged
    -0.9338481085775568,  # compose_not_functional
)
ROLEPLAY_INTERCEPT = -5.87658392320949
CREATIVE_WEIGHTS = (
    -0.39239841274797554,  # has_system
    -0.17274838442264587,  # rp_terms_system
    -0.4544085679351113,  # rp_terms_user
    -1.690801572151505,  # rp_setup_user
    -0.8942684618407125,  # act_as_user
    -0.13988412893001273,  # card_fields
    -0.3179374647137343,  # persona_system
    -0.37964759233471945,  # persona_named
    -0.5083161069485613,  # user_cast_in_system
    -0.13693447839240488,  # assistant_system
    0.28144540756880465,  # fiction_words
    -1.0017114493656751,  # user_actions
    -0.694591903486422,  # user_first_person_act
    -0.5777569951680366,  # user_opens_with_quote
    -1.3288914895442299,  # user_title_vocative
    -0.3413419204449735,  # user_name_vocative
    -0.5278322581319762,  # user_names_persona
    -0.41319200296786135,  # user_you_personal
    0.6856702131338268,  # creative_forms
    2.8212302568641197,  # compose_request
    4.359078062502073,  # continue_request
    5.3469670352199925,  # invent_request
    2.661632834914422,  # imaginative
    0.9381991268528171,  # creative_system
    -1.1275253634508218,  # functional_form
    -1.8637731330085694,  # code
    -1.798441890912898,  # analysis
    -0.9512356072730301,  # question_open
    -0.9796453925154386,  # math
    0.11095361027364219,  # log_user_words
    -0.5929699618944234,  # persona_and_engaged
    2.3017190511377916,  # compose_not_functional
)
CREATIVE_INTERCEPT = -2.8978842028628122

# The set these were fitted on, and per-part precision and recall on it
LABELLED_SET_SHA256 = '763b81ecb81ee768b7c4c49772a73105f3436f96fc96cd52b0fab2ee0a28c07b'
IN_SAMPLE = {'hermes3-general': {'precision': 0.9643, 'recall': 0.9926},
 'hermes3-creative': {'precision': 0.9904, 'recall': 0.9904},
 'hermes3-roleplay': {'precision': 1.0, 'recall': 0.96}}
CV_METHOD = '5 x 5-fold stratified cross-validation (seed 13)'
CROSS_VALIDATED = {'hermes3-general': {'precision': 0.9463, 'recall': 0.9838},
 'hermes3-creative': {'precision': 0.9807, 'recall': 0.9788},
 'hermes3-roleplay': {'precision': 0.9873, 'recall': 0.936}}
